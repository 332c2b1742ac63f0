"""docs/server_args.md's table of upstream SGLang's flags agrees with the parser: every flag it
names as supported or accepted parses, every flag it names as refused stops the launch in a line
or two naming the flag, and every flag the parser refuses or accepts by name is in the table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang.srt.server_args_refused import ALREADY_THE_BEHAVIOUR, REFUSED_FLAGS, LaunchArgumentParser

DOC = Path(__file__).resolve().parents[2] / "docs" / "server_args.md"
SECTION = "## Upstream SGLang's flags, group by group"


def upstream_table() -> list[tuple[str, list[str], list[str], list[str]]]:
    """(group, supported, accepted, refused) per row; each flag as written, with its value if any."""
    text = DOC.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("upstream group", "---"):
            continue
        # A refused flag's cell also names alternatives, in parentheses: those are not refused.
        cells[3] = re.sub(r"\([^)]*\)", "", cells[3])
        flags = [[code for code in re.findall(r"`([^`]+)`", cell) if code.startswith("--")] for cell in cells[1:]]
        rows.append((cells[0], *flags))
    return rows


ROWS = upstream_table()
SUPPORTED = [flag for _, supported, accepted, _ in ROWS for flag in supported + accepted if "*" not in flag]
REFUSED = [flag for _, _, _, refused in ROWS for flag in refused]


def test_the_table_covers_upstreams_groups():
    groups = {group for group, *_ in ROWS}
    assert len(groups) >= 14, groups
    assert {"model and tokenizer", "LoRA", "speculative decoding", "prefill-decode disaggregation"} <= groups


@pytest.mark.parametrize("written", SUPPORTED)
def test_every_flag_named_supported_or_accepted_parses(written):
    """As the command line reads it (whether a value also suits this machine, e.g. triton without a
    GPU, is ServerArgs's check, tested with each flag)."""
    parser = LaunchArgumentParser()
    ServerArgs.add_cli_args(parser)
    flag, *value = written.split()
    # Upstream's short names (--tp, --dp) are argparse abbreviations of exactly one flag of ours.
    matches = {a for a in parser._actions if flag in a.option_strings} or {
        a for a in parser._actions if any(s.startswith(flag) for s in a.option_strings)
    }
    assert len(matches) == 1, (flag, matches)
    action = matches.pop()
    if not value and action.nargs != 0:  # a flag named without a value: one it takes
        value = [str(action.choices[0] if action.choices else action.default or 1)]
    args, unknown = parser.parse_known_args([flag, *value])
    assert not unknown, unknown
    assert action.nargs != 0 or getattr(args, action.dest) is True


@pytest.mark.parametrize("written", REFUSED)
def test_every_flag_named_refused_stops_the_launch_in_a_line_or_two(capsys, written):
    flag = written.split()[0]
    with pytest.raises(SystemExit) as exc:
        prepare_server_args(written.split())
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) <= 2 and "usage:" not in err, err
    assert written in err or (flag in err and flag in REFUSED_FLAGS), err


def test_every_flag_refused_or_accepted_by_name_is_in_the_table():
    named = {flag.split()[0] for flag in SUPPORTED + REFUSED}
    assert not set(REFUSED_FLAGS) - named, sorted(set(REFUSED_FLAGS) - named)
    assert not set(ALREADY_THE_BEHAVIOUR) - named, sorted(set(ALREADY_THE_BEHAVIOUR) - named)
