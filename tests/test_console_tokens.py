"""The console's tokens, session cookies and CSRF tokens (worker/console/tokens.py)."""

from __future__ import annotations

import pytest

from worker.console.tokens import (
    EDITOR,
    SESSION_SECONDS,
    VIEWER,
    TokenError,
    Tokens,
    csrf_ok,
    csrf_token,
    load_tokens,
    session_cookie,
    session_role,
)

E, V = "e" * 20, "v" * 20
TOKENS = Tokens(E, V)


def test_tokens_from_the_environment_or_a_file(tmp_path):
    assert load_tokens({"INTENTSTREAM_CONSOLE_TOKEN": E}) == Tokens(E, None)
    secret = tmp_path / "viewer"
    secret.write_text(V + "\n")
    assert load_tokens({"INTENTSTREAM_CONSOLE_VIEWER_TOKEN_FILE": str(secret)}) == Tokens(None, V)
    both = {"INTENTSTREAM_CONSOLE_TOKEN": E, "INTENTSTREAM_CONSOLE_VIEWER_TOKEN": V}
    assert load_tokens(both) == TOKENS


@pytest.mark.parametrize(
    ("env", "says"),
    [({}, "serves nothing without a token"),
     ({"INTENTSTREAM_CONSOLE_TOKEN": "short"}, "shorter than 16"),
     ({"INTENTSTREAM_CONSOLE_TOKEN": E, "INTENTSTREAM_CONSOLE_VIEWER_TOKEN": E}, "the same"),
     ({"INTENTSTREAM_CONSOLE_TOKEN_FILE": "/nonexistent/token"}, "cannot read")],
)  # fmt: skip
def test_unusable_tokens_are_refused(env, says):
    with pytest.raises(TokenError, match=says):
        load_tokens(env)


def test_each_token_grants_its_role_and_nothing_else_does():
    assert TOKENS.role_of(E) == EDITOR and TOKENS.role_of(V) == VIEWER
    for wrong in ("", E[:-1], E + "e", V.upper(), "\0" * 32):
        assert TOKENS.role_of(wrong) is None
    assert Tokens(E, None).role_of("") is None  # an absent role is no empty token
    assert E not in TOKENS.fingerprint(EDITOR) and len(TOKENS.fingerprint(EDITOR)) == 8


def test_a_session_cookie_is_its_role_until_it_expires_and_only_as_signed():
    cookie = session_cookie(TOKENS, VIEWER, now=1000.0)
    assert session_role(TOKENS, cookie, now=1000.0 + SESSION_SECONDS - 1) == VIEWER
    assert session_role(TOKENS, cookie, now=1000.0 + SESSION_SECONDS) is None
    assert session_role(TOKENS, cookie.replace("viewer", "editor", 1), now=1000.0) is None
    assert session_role(Tokens(E, "w" * 20), cookie, now=1000.0) is None  # a rotated token
    assert session_role(TOKENS, "", now=1000.0) is None
    assert E not in cookie and V not in cookie


def test_a_csrf_token_belongs_to_its_session():
    one, other = session_cookie(TOKENS, EDITOR), session_cookie(TOKENS, EDITOR)
    assert one != other  # each sign-in has its own nonce
    assert csrf_ok(TOKENS, one, csrf_token(TOKENS, one))
    assert not csrf_ok(TOKENS, one, csrf_token(TOKENS, other))
    assert not csrf_ok(TOKENS, one, "")
