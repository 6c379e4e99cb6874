//! haven-server (placeholder, being written)
