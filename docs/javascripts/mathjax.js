// MathJax 3 for the documentation site (mkdocs.yml): the pages' math comes from
// pymdownx.arithmatex (generic: \( \) and \[ \] inside .arithmatex), the notebooks' from their
// Markdown cells as nbconvert leaves it ($ $ and $$ $$). Code and outputs are <pre> and <code>,
// which MathJax skips, so a dollar sign there stays a dollar sign.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: "tex2jax_ignore",
    processHtmlClass: "tex2jax_process|arithmatex",
  },
  svg: { fontCache: "global" },
};
