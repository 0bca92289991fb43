"""Reference speech plugins: Whisper ASR, Piper TTS, text responders."""
