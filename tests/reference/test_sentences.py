from duplex_agent.plugins.reference.sentences import ClauseSplitter


def split_stream(text: str, step: int) -> list[str]:
    splitter = ClauseSplitter()
    out: list[str] = []
    for i in range(0, len(text), step):
        out += splitter.feed(text[i : i + step])
    rest = splitter.flush()
    return out + ([rest] if rest else [])


def test_sentence_ends_are_emitted_when_whitespace_follows():
    splitter = ClauseSplitter()
    assert splitter.feed("Hello there!") == []  # could still be "!?" or a closing quote
    assert splitter.feed(" How") == ["Hello there!"]
    assert splitter.feed(" are you? I'm fine; thanks") == ["How are you?", "I'm fine;"]
    assert splitter.flush() == "thanks"
    assert splitter.flush() is None


def test_numbers_times_and_abbreviations_stay_intact():
    text = "It costs 3.5 dollars. Dr. Smith arrives at 10:30 today. Next: this"
    for step in (1, 3, 100):
        assert split_stream(text, step) == [
            "It costs 3.5 dollars.",
            "Dr. Smith arrives at 10:30 today.",
            "Next:",
            "this",
        ]


def test_comma_splits_only_after_six_words():
    text = "Well, okay. If you go to the store today, buy milk, please."
    assert split_stream(text, 2) == ["Well, okay.", "If you go to the store today,", "buy milk, please."]


def test_quotes_ellipses_and_line_breaks():
    text = 'He said "stop." Then... nothing\n- item one\n- item two'
    assert split_stream(text, 4) == ['He said "stop."', "Then...", "nothing", "- item one", "- item two"]


def test_empty_input():
    splitter = ClauseSplitter()
    assert splitter.feed("") == []
    assert splitter.feed("   ") == []
    assert splitter.flush() is None
