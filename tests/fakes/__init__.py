"""Real, in-process stand-ins for external services (servers on 127.0.0.1), reused across tests."""
