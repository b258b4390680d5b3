"""What travels between processes: framing, typed messages, precision, authentication, handshake."""
