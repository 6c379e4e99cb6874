//! haven-journal (placeholder, being written)
