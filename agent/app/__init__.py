"""The application: CLI, settings, bootstrap, HTTP server, realtime websocket, LiveKit worker, shutdown."""
