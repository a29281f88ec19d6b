"""The pull consumer routes: their handlers (``handlers``), the DRF views that document them and
serve the full stack (``views``), and the fast lane that routes the hot ones (``fast_lane``)."""
