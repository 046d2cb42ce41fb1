"""A generation ended by a stop string, as vLLM returns it (every sampled token, the stop string's too),
cut where its text ends: the token ids, their log-probs and what the loop appends next agree with the
text the protocol parsed (issue 23, fix 8)."""

import pytest
from trainer_entry.agent_loop import cut_at_stop
from trainer_entry.protocols import get_protocol


class PieceTokenizer:
    """Token i is the string PIECES[i]: any token boundary a real BPE could make, chosen by the test."""

    def __init__(self, pieces):
        self.pieces = list(pieces)

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.pieces[i] for i in ids)

    def encode(self, text, add_special_tokens=False):
        ids = []
        while text:  # longest known piece first, else one character at a time
            match = max((p for p in self.pieces if text.startswith(p)), key=len, default=None)
            if match is None:
                self.pieces.append(text[0])
                match = text[0]
            ids.append(self.pieces.index(match))
            text = text[len(match) :]
        return ids


REACT = get_protocol("react")
PYTHON = get_protocol("python-tags")


def generate(tokenizer, pieces):
    ids = [tokenizer.pieces.index(p) for p in pieces]
    return ids, [-(i + 1) / 10 for i in range(len(ids))]


def test_react_stop_tokens_are_dropped_with_their_log_probs():
    tok = PieceTokenizer(['Action Input: {"code": "1"}', "\n", "Observation", ":"])
    ids, lps = generate(tok, ['Action Input: {"code": "1"}', "\n", "Observation", ":"])
    cut = cut_at_stop(tok, ids, lps, REACT.stop, REACT.include_stop, REACT.observation_start())
    assert tok.decode(cut.token_ids) == 'Action Input: {"code": "1"}'
    assert cut.log_probs == lps[:1] and cut.gap_ids == [] and cut.carried == ""


def test_a_token_across_the_cut_is_kept_when_the_observation_begins_with_its_rest():
    """`}\\n` holds the end of the JSON and the stop's newline: kept (the model sampled it), and the
    observation that follows starts after its newline."""
    tok = PieceTokenizer(['Action Input: {"code": "1"', "}\n", "Observation", ":"])
    ids, lps = generate(tok, ['Action Input: {"code": "1"', "}\n", "Observation", ":"])
    cut = cut_at_stop(tok, ids, lps, REACT.stop, REACT.include_stop, REACT.observation_start())
    assert (cut.token_ids, cut.log_probs, cut.gap_ids, cut.carried) == (ids[:2], lps[:2], [], "\n")
    context = tok.decode(cut.token_ids) + REACT.observation("1")[len(cut.carried) :]
    assert context == 'Action Input: {"code": "1"}\nObservation: 1\n'


def test_a_token_across_the_cut_that_the_observation_does_not_continue_is_encoded_again_unmasked():
    """` Observation` (stop `Observation:` after a space): the space is context the model wrote, but
    the sampled token also holds the stop string, so it is neither kept nor trained."""
    tok = PieceTokenizer(['Action Input: {"code": "1"}', " Observation", ":"])
    ids, lps = generate(tok, ['Action Input: {"code": "1"}', " Observation", ":"])
    cut = cut_at_stop(tok, ids, lps, REACT.stop, REACT.include_stop, REACT.observation_start())
    assert (cut.token_ids, cut.log_probs, cut.carried) == (ids[:1], lps[:1], "")
    assert tok.decode(cut.gap_ids) == " "


def test_an_included_stop_string_keeps_its_tokens():
    tok = PieceTokenizer(["<PYTHON>print(1)", "</", "PYTHON>"])
    ids, lps = generate(tok, ["<PYTHON>print(1)", "</", "PYTHON>"])
    cut = cut_at_stop(tok, ids, lps, PYTHON.stop, PYTHON.include_stop, PYTHON.observation_start())
    assert (cut.token_ids, cut.log_probs, cut.gap_ids, cut.carried) == (ids, lps, [], "")


def test_an_included_stop_strings_last_token_may_carry_the_observations_start():
    tok = PieceTokenizer(["<PYTHON>print(1)", "</PYTHON>\n"])
    ids, lps = generate(tok, ["<PYTHON>print(1)", "</PYTHON>\n"])
    cut = cut_at_stop(tok, ids, lps, PYTHON.stop, PYTHON.include_stop, PYTHON.observation_start())
    assert (cut.token_ids, cut.carried) == (ids, "\n")
    context = tok.decode(cut.token_ids) + PYTHON.observation("1")[len(cut.carried) :]
    assert context == "<PYTHON>print(1)</PYTHON>\n<PYTHON-OUTPUT>\n1\n</PYTHON-OUTPUT>\n"


@pytest.mark.parametrize("pieces", [["The answer is 4", "2."], []])
def test_a_generation_without_a_stop_string_is_unchanged(pieces):
    tok = PieceTokenizer(["The answer is 4", "2."])
    ids, lps = generate(tok, pieces)
    cut = cut_at_stop(tok, ids, lps, REACT.stop, REACT.include_stop, REACT.observation_start())
    assert (cut.token_ids, cut.log_probs, cut.gap_ids, cut.carried) == (ids, lps, [], "")


def test_the_first_stop_string_in_the_text_ends_it():
    """vLLM stops at the first match; of two stops at one place the longer one is the match."""
    tok = PieceTokenizer(["a", "\nObservation:", " b", "Observation:"])
    ids, lps = generate(tok, ["a", "\nObservation:", " b", "Observation:"])
    cut = cut_at_stop(tok, ids, lps, REACT.stop, REACT.include_stop, REACT.observation_start())
    assert cut.token_ids == ids[:1]
