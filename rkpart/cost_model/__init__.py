"""Cost model: features of candidate subgraphs, per-component predictors, and choosing partitions.

``fit / update / predict / save / load`` follow TVM's meta_schedule cost model interface.
"""

from rkpart.cost_model.calibration import compare_with_model, fit_profiles, render_comparison
from rkpart.cost_model.features import Features, group_features, stage_features
from rkpart.cost_model.model import CostModel, Sample, default_model_path
from rkpart.cost_model.select import Selection, SelectionConfig, choose

__all__ = ["CostModel", "Features", "Sample", "Selection", "SelectionConfig", "choose", "compare_with_model",
           "default_model_path", "fit_profiles", "group_features", "render_comparison", "stage_features"]
