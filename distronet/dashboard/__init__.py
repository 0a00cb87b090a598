"""The operator dashboard: one static web page (``static/``: index.html, app.js, style.css).

No Python runs here: the coordinator serves these files at ``/dashboard/``
(:mod:`distronet.coordinator.dashboard_static` finds them as package data), and the page talks
to the coordinator only over its HTTP JSON API and its server-sent event stream.
"""
