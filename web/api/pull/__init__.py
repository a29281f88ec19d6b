"""The pull consumer routes: their handlers (``handlers``) and the DRF views that document them and
serve the full stack (``views``); ``web.api.fast_lane`` routes the hot ones."""
