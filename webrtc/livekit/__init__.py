"""LiveKit rooms: serving a room's callers, and room tokens."""
