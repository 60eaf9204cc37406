"""floe's interactive shell, driven through a real pseudo-terminal (pexpect).

Run with the test venv made by scripts/test-env.sh (no servers needed):

    scripts/test-env.sh install
    eval "$(scripts/test-env.sh env)"
    FLOE_BIN=target/debug/floe "$FLOE_TEST_PYTHON" -m pytest -p no:cacheprovider tests/repl

Environment:
    FLOE_BIN                path to the floe binary (required)
    FLOE_REPL_TIMEOUT       seconds one expected output may take (default 20)

Each test starts its own floe with its own HOME (history goes to $HOME/.floe_history) and
its own working directory (relative catalog paths such as 'sqlite:lake/catalog.db' land
there). TERM is xterm: with TERM=dumb rustyline falls back to plain line reading, without
completion, history navigation or Ctrl-C handling. Patterns are regexes over the raw
terminal output; rustyline redraws the edited line as `floe> <line>`, which is what the
completion and history tests look for.

Everything lives in this one file on purpose: a tests/repl/conftest.py would be imported as
the module `conftest`, which tests/interop/test_interop.py imports names from, and
`pytest tests/interop tests/repl` would then fail to collect the interop tests. (What it
shares with the interop tests, finding the floe binary, it loads from their conftest by path.)
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence, Union

import pexpect
import pytest

TIMEOUT_S = float(os.environ.get("FLOE_REPL_TIMEOUT", "20"))
ROWS, COLS = 40, 200
PROMPT = "floe> "
# Keys, as the terminal sends them.
ENTER = "\r"
TAB = "\t"
UP = "\x1b[A"
CTRL_C = "\x03"
CTRL_D = "\x04"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]|\x07")

Pattern = Union[str, "re.Pattern[str]"]


def strip_ansi(text: str) -> str:
    """Terminal output without escape sequences, bells and carriage returns."""
    return _ANSI.sub("", text).replace("\r", "")


def _interop_helpers():
    """tests/interop/conftest.py, loaded under its own name (see the module doc): the one
    place that finds the floe binary."""
    path = Path(__file__).resolve().parents[1] / "interop" / "conftest.py"
    spec = importlib.util.spec_from_file_location("floe_interop_conftest", path)
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look themselves up there
        spec.loader.exec_module(module)
    return module


class Repl:
    """One floe REPL in a PTY, with expectations that fail with the terminal's output."""

    def __init__(self, binary: Path, home: Path, cwd: Path, args: Sequence[str] = ()):
        self.home = home
        self.cwd = cwd
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOE_")}
        env.update(HOME=str(home), TERM="xterm", COLUMNS=str(COLS), LINES=str(ROWS))
        env.pop("NO_COLOR", None)
        self.transcript = io.StringIO()
        self._mark = 0
        self.child = pexpect.spawn(
            str(binary),
            list(args),
            cwd=str(cwd),
            env=env,
            dimensions=(ROWS, COLS),
            encoding="utf-8",
            codec_errors="replace",
            timeout=TIMEOUT_S,
        )
        self.child.logfile_read = self.transcript

    # ------------------------------------------------------------------ output
    def screen(self, last: int = 4000) -> str:
        """The last characters the terminal showed, escape sequences removed."""
        return strip_ansi(self.transcript.getvalue())[-last:]

    def _fail(self, what: str, err: BaseException | None = None) -> None:
        before = self.child.before if isinstance(self.child.before, str) else ""
        status = ""
        if not self.child.isalive():
            status = (
                f"\nfloe exited: status={self.child.exitstatus} "
                f"signal={self.child.signalstatus}"
            )
        kind = f" ({type(err).__name__})" if err is not None else ""
        pytest.fail(
            f"{what}{kind}{status}\n"
            f"--- unmatched output (child.before, escapes removed) ---\n{strip_ansi(before)[-2000:]}\n"
            f"--- terminal transcript (end) ---\n{self.screen()}",
            pytrace=False,
        )

    def expect(self, pattern: Pattern | Sequence[Pattern], timeout: float | None = None) -> int:
        """Wait for a regex (or one of several); fail with the terminal's output if absent."""
        patterns = list(pattern) if isinstance(pattern, (list, tuple)) else [pattern]
        try:
            return self.child.expect(patterns, timeout=TIMEOUT_S if timeout is None else timeout)
        except (pexpect.TIMEOUT, pexpect.EOF) as e:
            err = e  # fail outside the handler: no chained pexpect dump in the report
        self._fail(f"expected {[getattr(p, 'pattern', p) for p in patterns]!r}", err)
        raise AssertionError("unreachable")

    def expect_exact(self, text: str, timeout: float | None = None) -> None:
        try:
            self.child.expect_exact(text, timeout=TIMEOUT_S if timeout is None else timeout)
            return
        except (pexpect.TIMEOUT, pexpect.EOF) as e:
            err = e
        self._fail(f"expected the text {text!r}", err)

    def expect_nothing(self, pattern: Pattern, seconds: float, why: str) -> None:
        """Assert that `pattern` does NOT show up within `seconds`."""
        try:
            self.child.expect(pattern, timeout=seconds)
        except pexpect.TIMEOUT:
            return
        except pexpect.EOF:
            ended = True
        else:
            ended = False
        if ended:
            self._fail(f"floe ended while checking that {why}")
        self._fail(f"{why}, but the terminal showed {self.child.after!r}")

    def expect_prompt(self, timeout: float | None = None) -> None:
        self.expect_exact(PROMPT, timeout)

    def output_since_mark(self) -> str:
        return strip_ansi(self.transcript.getvalue()[self._mark :])

    def mark(self) -> None:
        self._mark = len(self.transcript.getvalue())

    # ------------------------------------------------------------------ input
    def send(self, text: str) -> None:
        self.child.send(text)

    def line(self, text: str) -> None:
        """Type a line and press Enter."""
        self.child.send(text + ENTER)

    def run(self, sql: str, *expected: Pattern, timeout: float | None = None) -> str:
        """Type `sql` + Enter; wait for each expected regex in turn, then the next prompt.

        Returns what the terminal showed for it (escapes removed); fails if it shows
        `Error:` unless an expected pattern asks for it."""
        self.mark()
        self.line(sql)
        for p in expected:
            self.expect(p, timeout)
        self.expect_prompt(timeout)
        out = self.output_since_mark()
        if not any("Error" in getattr(p, "pattern", p) for p in expected):
            assert "Error:" not in out, f"{sql!r} failed:\n{out}"
        return out

    # ------------------------------------------------------------------ exit
    def wait_exit(self, timeout: float | None = None) -> int:
        """Wait for floe to end; returns the exit code (fails if it was killed by a signal)."""
        try:
            self.child.expect(pexpect.EOF, timeout=TIMEOUT_S if timeout is None else timeout)
            timed_out = False
        except pexpect.TIMEOUT:
            timed_out = True
        if timed_out:
            self._fail("expected floe to exit (TIMEOUT)")
        self.child.close()
        if self.child.signalstatus is not None:
            self._fail(f"floe was killed by signal {self.child.signalstatus}")
        return self.child.exitstatus

    def kill(self) -> None:
        if self.child.isalive():
            try:
                self.child.kill(signal.SIGKILL)
            except OSError:
                pass
        try:
            self.child.close(force=True)
        except Exception:
            pass


@pytest.fixture(scope="session")
def floe_bin() -> Path:
    return _interop_helpers()._floe_bin()


@pytest.fixture
def repl_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    return home


@pytest.fixture
def repl_cwd(tmp_path: Path) -> Path:
    cwd = tmp_path / "work"
    cwd.mkdir()
    return cwd


@pytest.fixture
def spawn_repl(floe_bin: Path, repl_home: Path, repl_cwd: Path) -> Iterator[Callable[[], Repl]]:
    """Start floe REPLs (sharing this test's HOME and cwd); waits for the first prompt.
    Every REPL still running at the end of the test is killed."""
    started: list[Repl] = []

    def spawn() -> Repl:
        r = Repl(floe_bin, repl_home, repl_cwd)
        started.append(r)
        r.expect_prompt()
        return r

    yield spawn
    for r in started:
        r.kill()


@pytest.fixture
def repl(spawn_repl: Callable[[], Repl]) -> Repl:
    return spawn_repl()


# -------------------------------------------------------------------------- tests

CREATE_LAKE = (
    "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql', "
    "'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse');"
)


# Row patterns of the table format: `| two |` and `| 2   |`.
def cell(text: str) -> str:
    return r"\|\s*" + re.escape(text) + r"\s*\|"


# A statement that runs for hours (10^12 rows) unless cancelled. The small input is the
# cross join's build side, so the probe side is polled (and the task yields) often:
# cancellation takes effect within a fraction of a second.
LONG_RUNNING = (
    "SELECT count(*) FROM (SELECT a.value FROM generate_series(1, 10000) a, "
    "generate_series(1, 100000000) b);"
)
# Also runs for hours, but with the big input as the build side: one poll of the probe
# side produces ~10^10 joined rows, so a worker thread runs for many seconds without
# yielding to tokio (see test_ctrl_c_cancels_cpu_bound_statement_promptly).
LONG_RUNNING_BIG_BUILD_SIDE = (
    "SELECT count(*) FROM (SELECT a.value FROM generate_series(1, 1000000) a, "
    "generate_series(1, 1000000) b);"
)
FINISHED = r"row\(s\) fetched|Error:"


@pytest.fixture
def lake_repl(repl: Repl) -> Repl:
    """A REPL with catalog `lake`, namespace `lake.db` and table `lake.db.t (id BIGINT)`."""
    repl.run(CREATE_LAKE, r"CREATE CATALOG")
    repl.run("CREATE SCHEMA lake.db;", r"CREATE SCHEMA")
    repl.run("CREATE TABLE lake.db.t (id BIGINT);", r"CREATE TABLE")
    return repl


def test_banner_prompt_and_query(repl: Repl) -> None:
    banner = repl.screen()
    assert re.search(r"floe \d+\.\d+\.\d+", banner), f"no version banner:\n{banner}"
    assert "\\? for help" in banner and "\\q to quit" in banner, banner
    assert banner.rstrip().endswith(PROMPT.rstrip()), f"no prompt after the banner:\n{banner}"

    out = repl.run("SELECT 1 + 1 AS two;", cell("two"), cell("2"), r"1 row\(s\) fetched")
    assert re.search(r"^\+-+\+$", out, re.M), f"no table border:\n{out}"
    # The session goes on: a second statement in the same REPL.
    repl.run("SELECT 'x' || 'y' AS xy;", cell("xy"), cell("xy"))


@pytest.mark.parametrize(
    "pending, last, cells",
    [
        # Nothing runs until the ';'.
        (["SELECT", "  42 AS answer"], ";", ["answer", "42"]),
        # A ';' inside an open string does not end the statement; the string keeps its
        # newline, so the table shows it as two lines.
        (["SELECT 'a;"], "b' AS s;", ["s", "a;", "b"]),
        # Nor does a ';' inside a -- comment.
        (["SELECT 7 AS seven -- not the end;"], ";", ["seven", "7"]),
    ],
    ids=["multi-line", "semicolon-in-string", "semicolon-in-comment"],
)
def test_a_statement_runs_only_when_complete(
    repl: Repl, pending: list[str], last: str, cells: list[str]
) -> None:
    for line in pending:
        repl.line(line)
        repl.expect_nothing(FINISHED, 1.0, f"{line!r} must not end the statement")
    assert repl.child.isalive()
    repl.line(last)
    for text in cells:
        repl.expect(cell(text))
    repl.expect(r"1 row\(s\) fetched")
    repl.expect_prompt()


def test_error_keeps_session_usable(repl: Repl) -> None:
    repl.run("SELEC 1;", r"Error: .*SELEC")
    assert repl.child.isalive()
    repl.run("SELECT * FROM no_such_table;", r"Error: .*no_such_table")
    repl.run("CREATE TABLE mem AS VALUES (1), (2);", r"\n")
    repl.run("SELECT 2 AS after_error;", cell("after_error"), cell("2"))
    # State made before the errors is still there.
    repl.run("SELECT count(*) AS n FROM mem;", cell("n"), cell("2"))


def test_backslash_commands(repl: Repl) -> None:
    out = repl.run("\\?", r"\\d NAME", r"\\dc")
    assert "\\d " in out and "\\q" in out, out

    repl.run(
        CREATE_LAKE + " CREATE SCHEMA lake.db; CREATE TABLE lake.db.t (id BIGINT);",
        "CREATE CATALOG",
        "CREATE SCHEMA",
        "CREATE TABLE",
    )
    repl.run("\\d", r"\|\s*lake\s*\|\s*db\s*\|\s*t\s*\|")
    repl.run("\\d lake.db.t", r"\|\s*id\s*\|\s*long\s*\|")
    repl.run("\\dn", r"\|\s*lake\s*\|\s*db\s*\|")
    repl.run("\\dc", r"\|\s*lake\s*\|\s*iceberg")
    out = repl.run("\\x", r"Error: [^\n]*\\x[^\n]*\\\?")
    # Still usable after the unknown command.
    repl.run("SELECT 5 AS five;", cell("five"), cell("5"))


def test_completes_table_names(lake_repl: Repl) -> None:
    repl = lake_repl
    # Names are refreshed after each statement; run one more to be sure.
    repl.run("SELECT 1 AS one;", cell("one"))
    repl.send("SELECT * FROM lake.db.")
    repl.expect_exact("lake.db.")
    repl.send(TAB)
    # rustyline redraws the line with the completion; one candidate needs one Tab.
    repl.expect(r"floe> SELECT \* FROM lake\.db\.t(?=[^\w.$])")
    # Run the completed line: it must name the real table.
    repl.mark()
    repl.send(";\r")
    repl.expect(cell("id"))
    repl.expect(r"0 row\(s\) fetched")
    repl.expect_prompt()
    assert "Error:" not in repl.output_since_mark(), repl.output_since_mark()

    # Namespaces complete too.
    repl.send("SELECT * FROM lake.d")
    repl.expect_exact("lake.d")
    repl.send(TAB)
    repl.expect(r"floe> SELECT \* FROM lake\.db(?=[^\w.$])")
    repl.send(CTRL_C)
    repl.expect_prompt()


@pytest.mark.parametrize(("typed", "completed"), [("SEL", "SELECT"), ("sel", "select")])
def test_completes_keywords(repl: Repl, typed: str, completed: str) -> None:
    repl.send(typed)
    repl.expect_exact(typed)
    repl.send(TAB)
    repl.expect(r"floe> " + completed + r"(?=[^\w])")
    repl.mark()
    repl.send(" 'kw' AS k;\r")
    repl.expect(cell("k"))
    repl.expect(cell("kw"))
    repl.expect_prompt()


def test_ctrl_c_at_prompt_clears_line(repl: Repl) -> None:
    # One line, an unterminated string: if it were kept, the next line would join it.
    repl.send("SELECT 'junk")
    repl.expect_exact("'junk")
    repl.child.sendintr()
    repl.expect_prompt()
    assert repl.child.isalive(), "Ctrl-C at the prompt ended floe"
    repl.run("SELECT 3 AS three;", cell("three"), cell("3"))

    # In the middle of a multi-line statement it drops all of it.
    repl.line("SELECT")
    repl.line("  'half' AS h")
    repl.expect_nothing(FINISHED, 0.5, "an unfinished statement must not run")
    repl.child.sendintr()
    repl.expect_prompt()
    out = repl.run("SELECT 4 AS four;", cell("four"), cell("4"))
    assert "half" not in out.split("SELECT 4 AS four;", 1)[-1], out
    assert repl.child.isalive()


def _cancel(repl: Repl, sql: str, cancel_within: float) -> float:
    """Start `sql`, check it is still running after 2 s, press Ctrl-C and wait for the
    cancellation; returns how long cancelling took."""
    repl.line(sql)
    repl.expect_exact("\n")  # Enter accepted: the statement is running
    repl.expect_nothing(FINISHED, 2.0, "the long statement should still be running after 2 s")
    assert repl.child.isalive()
    start = time.monotonic()
    repl.child.sendintr()
    repl.expect(r"Error: [^\n]*cancelled", timeout=cancel_within)
    took = time.monotonic() - start
    repl.expect_prompt()
    assert repl.child.isalive(), "Ctrl-C during a statement ended floe"
    return took


def test_ctrl_c_cancels_running_statement(repl: Repl) -> None:
    _cancel(repl, LONG_RUNNING, cancel_within=20)
    repl.run("SELECT 6 AS six;", cell("six"), cell("6"))
    # A second cancellation works as well.
    _cancel(repl, LONG_RUNNING, cancel_within=20)
    repl.run("SELECT 8 AS eight;", cell("eight"), cell("8"))


def test_ctrl_c_cancels_cpu_bound_statement_promptly(repl: Repl) -> None:
    _cancel(repl, LONG_RUNNING_BIG_BUILD_SIDE, cancel_within=10)
    repl.run("SELECT 9 AS nine;", cell("nine"), cell("9"))


def test_history_persists_across_sessions(spawn_repl: Callable[[], Repl]) -> None:
    first = spawn_repl()
    first.run("SELECT 12345 AS remembered;", cell("remembered"), cell("12345"))
    first.line("\\q")
    assert first.wait_exit() == 0, "\\q must exit with code 0"

    history = first.home / ".floe_history"
    assert history.is_file(), f"{history} was not written"
    assert "SELECT 12345 AS remembered;" in history.read_text(), history.read_text()

    second = spawn_repl()
    # The query is the newest entry (`\q` is not recorded); allow for older ones too.
    wanted = r"floe> SELECT 12345 AS remembered;"
    for _ in range(3):
        second.send(UP)
        # Another entry: a whole redrawn line (up to its '\r'), so a partial read of the
        # wanted line cannot be taken for it.
        if second.expect([wanted, r"floe> [^\r\n]*\r"]) == 0:
            break
    else:
        pytest.fail(f"Up arrow did not recall the query:\n{second.screen()}", pytrace=False)
    second.mark()
    second.send("\r")
    second.expect(cell("12345"))
    second.expect_prompt()


def test_history_keeps_no_secrets(spawn_repl: Callable[[], Repl]) -> None:
    """Option values of secret keys and URL passwords are masked before a statement is kept
    (the statement itself runs with them)."""
    repl = spawn_repl()
    repl.run(
        "CREATE SOURCE s WITH ('connector' = 'datagen', 'sasl.password' = 'hunter2', "
        "'registry' = 'http://me:s3cr3t@127.0.0.1:1/');",
        "Error",
    )
    repl.run("SELECT 7 AS seven;", cell("seven"))
    repl.line("\\q")
    assert repl.wait_exit() == 0
    history = (repl.home / ".floe_history").read_text()
    assert "CREATE SOURCE s WITH" in history and "'sasl.password' = '****'" in history, history
    assert "http://me:****@127.0.0.1:1/" in history, history
    for secret in ("hunter2", "s3cr3t"):
        assert secret not in history, history


def test_ctrl_d_exits_with_zero(spawn_repl: Callable[[], Repl]) -> None:
    repl = spawn_repl()
    repl.run("SELECT 'bye' AS msg;", cell("bye"))
    repl.send(CTRL_D)
    assert repl.wait_exit() == 0, "Ctrl-D at an empty prompt must exit with code 0"
    history = repl.home / ".floe_history"
    assert history.is_file() and "SELECT 'bye' AS msg;" in history.read_text()


JOB_SCRIPT = """
CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql',
  'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse');
CREATE SCHEMA lake.p; CREATE TABLE lake.p.t (order_id BIGINT);
CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders',
  'number-of-rows' = '20000', 'rows-per-second' = '10000');
SET 'pipeline.name' = 'progress'; SET 'checkpoint.interval' = '300ms';
INSERT INTO lake.p.t SELECT order_id FROM gen;
"""


def test_script_shows_a_progress_line_on_a_terminal_only(floe_bin: Path, tmp_path: Path) -> None:
    (tmp_path / "job.sql").write_text(JOB_SCRIPT)
    child = pexpect.spawn(
        str(floe_bin),
        ["-q", "-f", "job.sql"],
        cwd=str(tmp_path),
        env={**os.environ, "TERM": "xterm"},
        dimensions=(40, 200),
        encoding="utf-8",
        timeout=TIMEOUT_S,
    )
    child.expect(r"progress: \d+ in, \d+ out, \d+/s, checkpoint \d+")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, strip_ansi(child.before or "")

    # Not a terminal: no progress line at all.
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "job.sql").write_text(JOB_SCRIPT)
    done = subprocess.run(
        [str(floe_bin), "-q", "-f", "job.sql"],
        cwd=str(tmp_path / "again"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and done.stdout == "", (done.stdout, done.stderr)


def test_the_repl_connects_to_a_server(
    floe_bin: Path, repl_home: Path, repl_cwd: Path, tmp_path: Path
) -> None:
    """`floe --connect`: the same REPL, its statements run by a server (floe serve)."""
    import socket

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    port = free_port()
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        [str(floe_bin), "serve", "--listen", f"127.0.0.1:{port}", "--state-dir",
         str(tmp_path / "state"), "--dashboard", f"127.0.0.1:{free_port()}"],
        cwd=repl_cwd, stdout=log, stderr=log)
    try:
        deadline = time.time() + 60
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "floe serve did not listen"
                time.sleep(0.1)
        url = f"postgres://floe@127.0.0.1:{port}/floe"
        repl = Repl(floe_bin, repl_home, repl_cwd, ["--connect", url])
        try:
            repl.expect_prompt()
            assert f"connected to {url}" in repl.screen(), repl.screen()
            repl.run(CREATE_LAKE, r"CREATE CATALOG")
            repl.run("CREATE SCHEMA lake.db;", r"CREATE SCHEMA")
            repl.run("CREATE TABLE lake.db.t (id BIGINT);", r"CREATE TABLE")
            repl.run("INSERT INTO lake.db.t VALUES (1), (2);")
            repl.run("SELECT count(*) AS n FROM lake.db.t;", cell("n"), cell("2"),
                     r"1 row\(s\) fetched")
            # An error is the server's message; the connection goes on.
            repl.run("SELECT * FROM lake.db.nope;", r"Error: [^\n]*nope")
            repl.run("SELECT 5 AS five;", cell("five"), cell("5"))
            # Names complete from the server's catalogs.
            repl.send("SELECT * FROM lake.db.")
            repl.send(TAB)
            repl.expect(r"lake\.db\.t")
            repl.child.sendintr()
            repl.expect_prompt()
            # Ctrl-C cancels the statement on the server, and the connection goes on.
            _cancel(repl, LONG_RUNNING, cancel_within=20)
            repl.run("SELECT 6 AS six;", cell("six"), cell("6"))
            repl.line("\\q")
            assert repl.wait_exit() == 0
        finally:
            repl.kill()
        # What the REPL did is the server's: another client sees it.
        other = Repl(floe_bin, repl_home, repl_cwd, ["--connect", url])
        try:
            other.expect_prompt()
            other.run("SELECT count(*) AS n FROM lake.db.t;", cell("n"), cell("2"))
        finally:
            other.kill()
    finally:
        server.kill()
        server.wait()
        log.close()
