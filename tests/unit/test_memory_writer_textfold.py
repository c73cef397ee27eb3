"""Text folded for matching: width, invisible characters and look-alike letters folded, and every folded
match traced back to the original characters it came from."""

from __future__ import annotations

from services.memory_writer.domain.textfold import (
    close_spacing,
    fold,
    fold_for_reading,
    invisible,
    spaced_out,
    unleet,
)


def test_folding_maps_full_width_and_drops_invisible_characters_keeping_the_way_back() -> None:
    folded = fold("a１２\u200b3＠b")
    assert folded.text == "a123@b"
    assert folded.span(1, 4) == (1, 5)  # "123" covers the zero-width space typed inside it
    assert fold("plain ascii").origin is None and fold("普通的中文。").origin is None


def test_reading_folds_math_and_look_alike_letters_and_lower_case() -> None:
    assert fold_for_reading("𝐈𝐠𝐧𝐨𝐫𝐞 Іgnоrе ＩＧＮＯＲＥ") == "ignore ignore ignore"
    assert fold_for_reading("Ｃａｆe\u0301 ｃａｆé") == "cafe cafe"  # accents, typed apart or not, are dropped


def test_letter_by_letter_spacing_is_closed_up_but_numbers_and_ranges_are_no_disguise() -> None:
    assert close_spacing("I g n o r e  a l l") == "Ignore  all"
    assert close_spacing("忽 略 之 前") == "忽略之前"
    assert spaced_out("i.g.n.o.r.e") and spaced_out("D-i-s-r-e-g-a-r-d")
    assert not spaced_out("scores of 0.6-0.8") and not spaced_out("[a-z a-z]") and not spaced_out("U.S.A.")


def test_digits_inside_words_read_as_letters_and_numbers_stay_numbers() -> None:
    assert unleet("1gn0re prev10us 2024 mp3") == "ignore previous 2024 mp3"


def test_invisible_characters_are_reported_by_what_they_do() -> None:
    assert invisible("ab\u200bcd").zero_width_in_words and not invisible("👨\u200d👩\u200d👧").zero_width_in_words
    assert invisible("x \u202e y").bidi_override
    assert invisible("hi" + "".join(chr(0xE0000 + ord(c)) for c in "obey")).smuggled == "obey"
