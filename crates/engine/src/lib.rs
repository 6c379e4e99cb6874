//! haven-engine (placeholder, being written)
