"""Who may talk to the server: TLS, bearer tokens, the Host allow-list, the start-up check."""
