"""User text in figures is shown as written, never read as mathtext.

matplotlib reads a text with two ``$`` as mathtext: a task named ``a$^{$b`` (or a setting, a
metric, a label a user chose) fails to draw, an internal error after the work is done.
[`plain`][headcount.analysis.figtext.plain] escapes one string; [`literal_texts`][headcount.analysis.figtext.literal_texts] escapes every text a figure holds
(titles, axis labels, legends, annotations, fixed tick labels), and is called where figures are
rendered ([`headcount.analysis.plots`][headcount.analysis.plots] saving, the report's ``figure_png``), so a figure
drawn anywhere is covered. headcount's own figures use no mathtext; numeric tick labels (which
may) are left alone.

No matplotlib import at module level: ``headcount --help`` loads the report modules.
"""

from __future__ import annotations

import re

_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")


def plain(text) -> str:
    """``text`` as matplotlib draws it literally: every ``$`` not yet escaped becomes ``\\$``
    (so escaping twice changes nothing).

    >>> plain("a$^{$b")
    'a\\\\$^{\\\\$b'
    >>> plain(plain("5$")) == plain("5$")
    True
    """
    return _UNESCAPED_DOLLAR.sub(r"\\$", str(text))


def literal_texts(fig) -> None:
    """Escape every user-set text of ``fig`` in place (before it is drawn)."""
    from matplotlib.text import Text
    from matplotlib.ticker import FixedFormatter, FuncFormatter

    ticks = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            # tick labels a caller set (task names: set_xticks(ticks, labels) makes a FuncFormatter,
            # set_xticklabels a FixedFormatter); a number formatter's labels are left as they are
            for get, put in ((axis.get_major_formatter, axis.set_major_formatter),
                             (axis.get_minor_formatter, axis.set_minor_formatter)):
                formatter = get()
                if isinstance(formatter, (FixedFormatter, FuncFormatter)) and not getattr(formatter, "_plain", False):
                    escaped = FuncFormatter(lambda x, pos=None, f=formatter: plain(f(x, pos)))
                    escaped._plain = True
                    put(escaped)
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                ticks.update((id(tick.label1), id(tick.label2)))
            ticks.add(id(axis.offsetText))
    for text in fig.findobj(Text):
        if id(text) not in ticks and "$" in text.get_text():
            text.set_text(plain(text.get_text()))
