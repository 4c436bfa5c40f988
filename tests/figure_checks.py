"""What a saved figure must be at its size: no text over another, no empty panel."""

from __future__ import annotations

import itertools

import matplotlib
import matplotlib.text
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.transforms import Bbox

from rlkit.figure_style import STYLE


def _shown_tick_labels(ax) -> list:
    """The tick labels ``ax`` draws: those of ticks inside the view limits (matplotlib keeps
    labels for the locator's ticks beyond them too, placed outside the panel and not drawn)."""
    labels = []
    for axis, coord, (lo, hi) in ((ax.xaxis, 0, ax.get_xlim()), (ax.yaxis, 1, ax.get_ylim())):
        lo, hi, pad = min(lo, hi), max(lo, hi), 1e-9 * (abs(hi - lo) or 1)
        for label in axis.get_ticklabels():
            if label.get_text() and lo - pad <= label.get_position()[coord] <= hi + pad:
                labels.append(label)
    return labels


def drawn_texts(fig) -> list[tuple[str, Bbox]]:
    """(text, its box in pixels) of every visible, non-empty text that saving ``fig`` draws: all
    read in the shared style, as rlkit and the notebooks save it (tick labels are made, and the
    ticks located, from the style's font size whenever they are asked for)."""
    with matplotlib.rc_context(STYLE):
        canvas = FigureCanvasAgg(fig)
        canvas.draw()  # lays the figure out as savefig does
        renderer = canvas.get_renderer()
        ticks = {
            id(t) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis) for t in axis.get_ticklabels()
        }
        shown = {id(t) for ax in fig.axes if ax.axison for t in _shown_tick_labels(ax)}
        return [
            (t.get_text(), t.get_window_extent(renderer))
            for t in fig.findobj(matplotlib.text.Text)
            if t.get_text() and t.get_visible() and (id(t) not in ticks or id(t) in shown)
        ]


def overlapping_texts(fig, gap_px: float = 2.0) -> list[tuple[str, str]]:
    """Pairs of texts of ``fig`` closer than ``gap_px`` pixels (overlapping or touching, as
    "140000160000": two tick labels read as one number)."""
    boxes = [(text, box.padded(gap_px / 2)) for text, box in drawn_texts(fig)]
    return [
        (a, b)
        for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2)
        if min(box_a.x1, box_b.x1) > max(box_a.x0, box_b.x0)
        and min(box_a.y1, box_b.y1) > max(box_a.y0, box_b.y0)
    ]


def empty_panels(fig) -> list[str]:
    """Titles of the panels of ``fig`` drawn with axes but no data line in them (a reference line
    such as a dashed 0 has no label); a panel with no data must say so instead: axes off and a
    note (:func:`notes`)."""
    return [
        ax.get_title()
        for ax in fig.axes
        if ax.axison and not any(not line.get_label().startswith("_") for line in ax.get_lines())
    ]


def notes(fig) -> dict[str, str]:
    """{title: note} of the panels drawn without axes (nothing to draw there, and why)."""
    return {
        ax.get_title(): " ".join(t.get_text() for t in ax.texts)
        for ax in fig.axes
        if not ax.axison and ax.get_title()
    }
