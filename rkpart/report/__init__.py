"""``rkpart report``: one self-contained HTML page (plots, tables) about a plan and its measurements."""
