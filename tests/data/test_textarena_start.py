"""Why a TextArena game does not start, named as what it is (issue 48; data/textarena_start.py):
NLTK data, an API key, a package, a bug inside textarena, or more players, each with what to do;
a stalled start is cut off; and every game the messages recommend starts here."""

from __future__ import annotations

import socket
import time
import traceback
import urllib.error

import pytest

from areal_graph.data import textarena_start as ts
from support.ci import optional


@pytest.fixture(scope="module")
def tg():
    optional("textarena", "pip install 'textarena==0.7.4' (in the dev extra)")
    from areal_graph.data import textarena_games

    return textarena_games


@pytest.mark.parametrize("game", ts.PLAYABLE_GAMES)
def test_every_recommended_game_starts_here(tg, game):
    assert tg.check_env(game) is None


def test_an_unknown_game_is_pointed_only_at_games_that_start(tg):
    message = tg.check_env("Hangmann-v0")
    assert "no game 'Hangmann-v0'" in message and "did you mean" not in message  # Hangman-v0 does not start
    assert "did you mean 'GuessTheNumber-v0'" in tg.check_env("GuessTheNumbr-v0")
    listed = message.split("start here include ")[1].split(", ")
    assert listed and set(listed) <= set(ts.PLAYABLE_GAMES)


def test_a_game_without_its_nltk_data_says_which_and_how_to_get_it(tg):
    message = tg.check_env("Hangman-v0")
    if message is None:
        pytest.skip("NLTK's words corpus is on this machine: Hangman starts")
    assert "cannot start here" in message and "NLTK data 'words'" in message, message
    assert "python -m nltk.downloader words" in message and "not single-player" not in message
    wordle = tg.check_env("Wordle-v0")
    assert "python -m nltk.downloader words averaged_perceptron_tagger_eng" in wordle, wordle


def test_a_game_that_needs_an_api_key_names_the_variable(tg, monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    message = tg.check_env("TwentyQuestions-v0")
    assert "needs an API key" in message and "OPENROUTER_API_KEY" in message, message


def test_a_bug_inside_textarena_is_named_with_its_file_and_line(tg):
    message = tg.check_env("Klondike-v0")
    assert "broken in this textarena version" in message, message
    assert "SyntaxError at textarena/envs/Klondike/env.py:119" in message and "bug in the library" in message
    assert "module textarena does not have (textarena.envs.UsedCar)" in tg.check_env("UsedCar-v0-balanced")


def test_a_game_that_needs_a_package_gives_the_pip_line(tg):
    try:
        import gym  # noqa: F401

        pytest.skip("gym is installed here: BabyAiText gets further")
    except ImportError:
        pass
    message = tg.check_env("BabyAiText-v0")
    assert "needs the Python package 'gym'" in message and "pip install gym" in message, message


def test_a_multi_player_game_says_how_many_players(tg):
    assert "is not single-player: it is a game for 2 players" in tg.check_env("TicTacToe-v0")
    assert "game for 3 players" in tg.check_env("ThreePlayerTicTacToe-v0")
    # a two-player game that sets up two players whatever it is given is caught after its reset
    assert "game for 2 players" in tg.check_env("QuantumTicTacToe-v0")


@pytest.mark.parametrize(
    "message, players",
    [
        ("The number of players has to be 2, received 1", "2"),
        ("2 ≤ players ≤ 15", "2 to 15"),
        ("German Whist is a two-player game only", "2"),
        ("Environment is hard-coded for exactly four players. Received 1", "4"),
        ("Number of players must be even for Taboo game.", "an even number of"),
        ("Briscola supports 2, 3, or 4 players", "2 to 4"),
        ("Golf supports 2-4 players", "2 to 4"),
        ("Number of players must be 2 or 3", "2 to 3"),
        ("The number of players has to be 1, received 2", None),
        ("Board size must be 3", None),
    ],
)
def test_player_counts_are_read_from_each_games_own_words(message, players):
    assert ts.players_needed(message) == players


def raised(err: BaseException) -> BaseException:
    try:
        raise err
    except BaseException as caught:  # noqa: BLE001
        return caught


@pytest.mark.parametrize(
    "err, kind, says",
    [
        (ModuleNotFoundError("No module named 'cv2'", name="cv2"), "package", "pip install opencv-python"),
        (KeyError("OPENAI_API_KEY"), "api-key", "set OPENAI_API_KEY"),
        (urllib.error.URLError("no route to host"), "network", "reaches the network"),
        (
            LookupError("Resource 'stopwords' not found. Please use the NLTK Downloader"),
            "data",
            "nltk.downloader stopwords",
        ),
        (AssertionError("The number of players has to be 2, received 1"), "multi-player", "for 2 players"),
        (ZeroDivisionError("division by zero"), "error", "ZeroDivisionError"),
    ],
)
def test_each_failure_is_classified_from_its_exception(err, kind, says):
    failure = ts.classify(raised(err))
    assert failure.kind == kind and says in failure.detail, failure


def test_a_stalled_start_is_cut_off_and_named_by_where_it_waits():
    t0 = time.monotonic()
    failure = ts.try_start(lambda: time.sleep(5), timeout_s=0.3)
    assert time.monotonic() - t0 < 2 and failure.kind == "timeout" and "did not finish within" in failure.detail
    nltk = traceback.StackSummary.from_list([("/site-packages/nltk/downloader.py", 1341, "_download_package", "")])
    assert ts.stalled(nltk, 30).kind == "data" and "python -m nltk.downloader" in ts.stalled(nltk, 30).detail
    net = traceback.StackSummary.from_list([(socket.__file__, 1, "recv_into", "")])
    assert ts.stalled(net, 30).kind == "network"
