"""The one look of every figure rlkit and the notebooks save: text readable at the saved size.

At ``FIGURE_DPI`` a point is 100/72 px, so the smallest text here (8 pt: ticks and legends) is
11 px high and titles 12.5 px; the old 6–7 pt legends at 80 dpi were 5–7 px glyphs, too small to
read in a README or a notebook at their size. Plain data, no matplotlib import: importing this
module never switches a notebook's plotting backend (nor does ``rlkit.plotting``: no pyplot).
"""

FIGURE_DPI = 100
STYLE = {
    "figure.dpi": FIGURE_DPI,
    "savefig.dpi": FIGURE_DPI,
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
}
