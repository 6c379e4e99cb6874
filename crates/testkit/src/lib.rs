//! haven-testkit (placeholder, being written)
