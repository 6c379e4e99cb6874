//! haven-stomp (placeholder, being written)
