"""The one-page report of a receipt (``oracles report``): read (:mod:`~oracles.report.load`), judged as the
receipt judged it (:mod:`~oracles.report.verdict`), grouped by family (:mod:`~oracles.report.sections`),
its figures read from the JSON (:mod:`~oracles.report.series`) and the npz sidecar
(:mod:`~oracles.report.positions`) as :class:`~oracles.report.curves.Curve` and drawn as SVG
(:mod:`~oracles.report.figures`, :mod:`~oracles.report.draw`), gathered (:mod:`~oracles.report.build`) and
written as HTML (:mod:`~oracles.report.page`, :mod:`~oracles.report.html`) and Markdown
(:mod:`~oracles.report.markdown`). Imports nothing heavy here: numpy and matplotlib only where they draw."""
