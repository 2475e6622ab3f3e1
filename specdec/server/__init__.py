"""`specdec serve`: an OpenAI-compatible HTTP server, a thin adapter over the engine."""
