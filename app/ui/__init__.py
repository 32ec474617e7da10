"""The hygiene explorer: one static page (index.html, app.js, app.css) served at `/ui` and
inlined into `prefixgate lint --html` reports (docs/ui.md)."""
