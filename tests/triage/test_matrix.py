"""The version x outcome table: verdicts, formatting, JSON (rows as a build would produce them)."""

from __future__ import annotations

from rkpart.triage.matrix import Matrix, MatrixRow, describe_outcome, version_key


def _row(version: str, kind: str, signal: str | None = None, code: int | None = 0,
         regex: bool | None = None) -> MatrixRow:
    return MatrixRow(version=version, kind=kind, exit_code=code, signal=signal, last_step="fuse_exnorm_add",
                     wall_s=4.25, peak_rss_bytes=310 << 20, rknn_size=0,
                     signature="exnorm-fusion-segv" if signal == "SIGSEGV" else None, regex_matched=regex,
                     message="", log=f"logs/x.{version}.log")


OK, SEGV = ("ok", None, 0), ("crash", "SIGSEGV", 139)


def _matrix(*rows: MatrixRow) -> Matrix:
    return Matrix(model="m.onnx", num_nodes=5, target="rk3588", rows=rows)


def test_verdicts() -> None:
    assert _matrix(_row("2.3.0", *OK), _row("2.3.2", *SEGV), _row("2.5.0", *OK)).verdict() == \
        "regression: builds with 2.3.0, fails with 2.3.2; fixed in 2.5.0"
    assert _matrix(_row("2.3.0", *SEGV), _row("2.3.2", *SEGV), _row("2.5.0", *OK)).verdict() == \
        "long-standing: fails with the oldest tested version 2.3.0; fixed in 2.5.0"
    assert _matrix(_row("2.3.0", *SEGV), _row("2.5.0", *SEGV)).verdict() == \
        "long-standing: fails with every tested version (2.3.0, 2.5.0)"
    assert _matrix(_row("2.3.0", *OK), _row("2.5.0", *OK)).verdict() == \
        "builds with every tested version (2.3.0, 2.5.0)"


def test_fail_regex_decides_what_failing_means() -> None:
    m = _matrix(_row("2.3.0", *OK, regex=True), _row("2.5.0", *SEGV, regex=False))
    assert m.failing == ("2.3.0",) and m.passing == ("2.5.0",)


def test_table_and_json() -> None:
    m = _matrix(_row("2.3.0", *OK), _row("2.3.2", *SEGV))
    text = m.format_table()
    assert text.splitlines()[0].split() == ["toolkit", "outcome", "last", "optimiser", "step", "build", "s",
                                            "peak", "RSS", "known", "issue"]
    assert "2.3.2    SIGSEGV (exit 139)  fuse_exnorm_add      4.2" in text
    md = m.format_table(markdown=True)
    assert "| 2.3.2 | SIGSEGV (exit 139) | fuse_exnorm_add | 4.2 | 310 MB | exnorm-fusion-segv |" in md
    assert Matrix.from_json(m.to_json()) == m
    assert m.to_json()["failing"] == ["2.3.2"]


def test_outcome_words_and_version_order() -> None:
    assert describe_outcome("crash", 139, "SIGSEGV") == "SIGSEGV (exit 139)"
    assert describe_outcome("error", 3, None) == "error (exit 3)"
    assert describe_outcome("timeout", 137, "SIGKILL") == "timeout"
    assert sorted(["2.10.0", "2.5.0", "2.3.2", "2.3.0"], key=version_key) == ["2.3.0", "2.3.2", "2.5.0", "2.10.0"]
