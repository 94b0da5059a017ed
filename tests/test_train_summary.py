"""The end-of-run summary table (`sparring.report.summary`): it fits an 80-column terminal
with the evaluation keys real runs log, and keeps each figure on one line."""

from __future__ import annotations

import io
import json

from rich.console import Console

from sparring.report.summary import format_value, print_summary, summary_table


def _sampled(where: str, games: int, value: float) -> dict[str, float]:
    """A sampled evaluation's keys as `sparring.eval.games` logs them (Wilson intervals)."""
    out = {f"eval/{where}/games": float(games), f"eval/{where}/mean_return": 2 * value - 1,
           f"eval/{where}/forfeit_rate": 0.0, f"eval/{where}/invalid_rate": 0.0}
    for metric, v in (("win", value * 0.9), ("loss", 1 - value), ("non_loss", value),
                      ("draw", value * 0.1)):
        out[f"eval/{where}/{metric}"] = v
        out[f"eval/{where}/{metric}_lo"] = max(0.0, v - 0.048733)
        out[f"eval/{where}/{metric}_hi"] = min(1.0, v + 0.0441)
    return out


def _exact(where: str, value: float) -> dict[str, float]:
    return {f"eval/{where}/win": 0.0, f"eval/{where}/loss": 1 - value,
            f"eval/{where}/non_loss": value, f"eval/{where}/blunder_states": 19.0,
            f"eval/{where}/non_loss_seat0": value, f"eval/{where}/non_loss_seat1": value}


def _rows(last_step: int) -> list[dict]:
    """Evaluations of the default recipe (tic-tac-toe against random, minimax and the exact
    player, the magnet too), Kuhn and Leduc poker (exploitability of the policy, the magnet
    and the time-average; the CFR bot), at the start and at ``last_step``."""
    rows = []
    for step, v in ((0, 0.48251), (last_step, 0.9987654)):
        row = {"step": step, "reward": 0.1}
        for where in ("tictactoe/random", "tictactoe/minimax", "kuhn_poker/random",
                      "kuhn_poker/cfr", "leduc_poker/cfr"):
            row.update(_sampled(where, 400, v))
        for where in ("tictactoe/minimax_exact", "tictactoe/minimax_exact_average"):
            row.update(_exact(where, v))
        for game in ("kuhn_poker", "leduc_poker"):
            row.update({f"eval/{game}/exploitability": 1 - v,
                        f"eval/{game}/exploitability_average": 1.0123456 - v,
                        f"eval/{game}/exploitability_time_average": 0.98 - v})
        rows.append(row)
    return rows


def _render(rows, tmp_path, width=80) -> str:
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    console = Console(width=width, record=True, file=io.StringIO())
    print_summary(tmp_path, console)
    return console.export_text()


def test_every_line_fits_80_columns_and_each_figure_stays_on_its_line(tmp_path):
    for last in (250, 20000):
        text = _render(_rows(last), tmp_path)
        lines = text.splitlines()
        assert max(len(x) for x in lines) <= 80, text
        assert f"start (step 0) -> end (step {last})" in text
        # one line per metric, start and end whole on it
        row = next(x for x in lines if "tictactoe/random" in x)
        after = lines[lines.index(row) + 1:]
        non_loss = next(x for x in after if x.strip("│ ").startswith("non_loss"))
        assert "0.4825 ±0.046" in non_loss and "0.9988 ±0.025" in non_loss
        assert "400" in row
        assert any("tictactoe/minimax_exact_average" in x for x in lines)
        assert any("exploitability_average" in x and "0.01358" in x for x in lines)


def test_a_key_logged_at_other_steps_says_its_own_step(tmp_path):
    rows = _rows(250)
    rows.insert(1, {"step": 100, "eval/nim/random/non_loss": 0.5})
    rows[-1]["eval/nim/random/non_loss"] = 0.75
    text = _render(rows, tmp_path)
    nim = text.splitlines()[next(i for i, x in enumerate(text.splitlines()) if "nim/random" in x) + 1]
    assert "0.5 (step 100)" in nim and "0.75" in nim
    assert max(len(x) for x in text.splitlines()) <= 80, text


def test_no_evaluation_no_table(tmp_path):
    assert summary_table([{"step": 1, "reward": 0.5}]) is None
    assert _render([{"step": 1, "reward": 0.5}], tmp_path) == ""


def test_format_value():
    assert format_value(0.48251, 0.4337, 0.5314) == "0.4825 ±0.049"
    assert format_value(19.0) == "19"
    assert format_value(1.0, 0.9905, 1.0) == "1 ±0.0047"
