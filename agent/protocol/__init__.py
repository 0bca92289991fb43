"""The duplex vocabulary: typed events, session configuration, audio formats; JSON only in the codec."""
