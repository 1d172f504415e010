"""fleetcare.models: the fleet-wide failure model — train, calibrate, explain, score.

- ``model``     ``FailureModel`` (LightGBM + calibration, scikit-learn conventions, bytes)
- ``reasons``   top contributors (``pred_contrib``) as sentences against the fleet
- ``metrics``   node-level evaluation: alarm episodes, false drains, recall at budget
- ``training``  ``train(store, ...)``: features + labels, split by time, fit, evaluate, save
- ``registry``  the ``models`` table: save / load / current / list_models / promote
- ``scoring``   ``score(store, ...)`` → ``gpu_scores`` / ``node_scores`` tables
"""

from fleetcare.models.model import FailureModel, FitError, ModelError, ModelFormatError
from fleetcare.models.reasons import explain, fleet_medians
from fleetcare.models.registry import ModelNotFoundError, ModelRecord
from fleetcare.models.scoring import (
    ScoreError,
    ScoreResult,
    latest_gpu_scores,
    latest_node_scores,
    score,
)
from fleetcare.models.training import TrainError, TrainResult, train

__all__ = [
    "FailureModel", "FitError", "ModelError", "ModelFormatError", "ModelNotFoundError",
    "ModelRecord", "ScoreError", "ScoreResult", "TrainError", "TrainResult", "explain",
    "fleet_medians", "latest_gpu_scores", "latest_node_scores", "score", "train",
]
