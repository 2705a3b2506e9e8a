"""``kaun-ir viz``: the interactive HTML page, the SVG renderer and the screenshot helper."""
