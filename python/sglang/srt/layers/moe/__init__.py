"""Mixture-of-experts layers: routing (`router.py`), the experts' computation (`fused_moe.py`) and
the module that holds a layer's stacked expert weights (`layer.py`)."""
