"""Reports: JSON journals, Markdown and self-contained HTML with charts."""
