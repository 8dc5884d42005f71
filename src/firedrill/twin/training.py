"""Training JobSets on the twin: gangs of GPUs that checkpoint, crash, hang and straggle."""

from __future__ import annotations

from typing import TYPE_CHECKING

from firedrill.errors import OperationError
from firedrill.model import operations as ops

if TYPE_CHECKING:
    from firedrill.twin.engine import Twin

TRAINING_OPS = (
    ops.SuspendJobSet,
    ops.ResumeJobSet,
    ops.SetQueueStopPolicy,
    ops.InjectHang,
    ops.InjectStraggler,
    ops.ClearTrainingFault,
)


class TrainingSim:
    """Owns the fleet's JobSets and Kueue ClusterQueues; the engine steps it and forwards ops."""

    def __init__(self, twin: Twin) -> None:
        self.twin = twin

    def step(self) -> None:
        """Advance every JobSet by one twin step (``twin.dt`` seconds, ending at ``twin.t``)."""

    def inverse(self, op: ops.Operation) -> ops.Operation:
        raise OperationError(f"training operations are not modelled: {op!r}")

    def apply(self, op: ops.Operation) -> None:
        raise OperationError(f"training operations are not modelled: {op!r}")

    def on_gpu_fault(self, node: int, gpu: int, *, fatal: bool) -> None:
        """A GPU of ``node`` failed (fatal: unusable until reset/reboot)."""

    def on_node_unavailable(self, node: int) -> None:
        """``node`` was drained, rebooted or went NotReady."""
