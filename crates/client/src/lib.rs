//! haven-client (placeholder, being written)
