"""AQ-SGD's per-sample buffers: one row per training sample id (``N x T x d`` per boundary),
held in memory or in a disk memmap (PROTOCOL.md §C3). Rows are allocated on first write, when the
message shape is known; a row that was never written is "not filled"."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

SAMPLE_STORAGE = ("memory", "memmap")


class SampleBuffers:
    """Rows of ``N`` samples.

    Args:
        num_samples: ``N``, one more than the largest sample id.
        storage: 'memory' (a CPU or device tensor) or 'memmap' (a file under ``directory``).
        directory: Where the memmap file goes (storage='memmap').
        name: File name stem (unique per rank, boundary and direction).
    """

    def __init__(
        self, num_samples: int, storage: str = "memory", directory: str | None = None, name: str = "buf"
    ) -> None:
        if storage not in SAMPLE_STORAGE:
            raise ValueError(f"aqsgd_storage={storage!r}: allowed values are {SAMPLE_STORAGE}")
        if storage == "memmap" and not directory:
            raise ValueError("aqsgd_storage='memmap' needs aqsgd_dir (a directory for the buffer files)")
        self.num_samples = num_samples
        self.storage = storage
        self.directory = directory
        self.name = name
        self.rows: torch.Tensor | None = None
        self.filled = torch.zeros(num_samples, dtype=torch.bool)
        self.path: Path | None = None

    def _allocate(self, row_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
        shape = (self.num_samples, *row_shape)
        if self.storage == "memory":
            self.rows = torch.zeros(shape, dtype=dtype, device=device)
            return
        np_dtype = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.int16}.get(dtype)
        if np_dtype is None:
            raise ValueError(f"aqsgd_storage='memmap' cannot hold {dtype} messages")
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        self.path = Path(self.directory) / f"{self.name}-{os.getpid()}.bin"
        array = np.memmap(self.path, mode="w+", dtype=np_dtype, shape=shape)
        rows = torch.from_numpy(array)
        self.rows = rows.view(torch.bfloat16) if dtype == torch.bfloat16 else rows
        self._memmap = array

    def _check_ids(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.reshape(-1).long().cpu()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_samples):
            raise ValueError(
                f"aqsgd: sample id {int(ids.max()) if int(ids.max()) >= self.num_samples else int(ids.min())} "
                f"is outside 0..{self.num_samples - 1}; set aqsgd_num_samples to one more than the largest id"
            )
        return ids

    def all_filled(self, ids: torch.Tensor) -> bool:
        return bool(self.filled[self._check_ids(ids)].all())

    def read(self, ids: torch.Tensor, device: torch.device) -> torch.Tensor:
        ids = self._check_ids(ids)
        if self.rows is None:
            raise RuntimeError("aqsgd: read before any write")
        rows_ids = ids.to(self.rows.device)
        return self.rows[rows_ids].to(device)

    def write(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        ids = self._check_ids(ids)
        if self.rows is None:
            self._allocate(
                tuple(values.shape[1:]),
                values.dtype,
                values.device if self.storage == "memory" else torch.device("cpu"),
            )
        self.rows[ids.to(self.rows.device)] = values.detach().to(self.rows.device, self.rows.dtype)
        self.filled[ids] = True

    def snapshot(self, ids: torch.Tensor) -> dict:
        """What ``restore`` needs to undo this step's writes to the rows ``ids``."""
        ids = self._check_ids(ids).unique()
        rows = None if self.rows is None else self.rows[ids.to(self.rows.device)].clone()
        return {"ids": ids, "rows": rows, "filled": self.filled[ids].clone()}

    def restore(self, snap: dict) -> None:
        ids = snap["ids"]
        if snap["rows"] is not None:
            self.rows[ids.to(self.rows.device)] = snap["rows"]
        self.filled[ids] = snap["filled"]

    @property
    def nbytes(self) -> int:
        """Bytes the rows take (in memory or on disk)."""
        return 0 if self.rows is None else self.rows.numel() * self.rows.element_size()

    def state_dict(self) -> dict:
        return {"rows": None if self.rows is None else self.rows.cpu().clone(), "filled": self.filled.clone()}

    def load_state_dict(self, state: dict, device: torch.device) -> None:
        self.filled = state["filled"].clone()
        rows = state["rows"]
        if rows is None:
            self.rows = None
            return
        self._allocate(
            tuple(rows.shape[1:]), rows.dtype, device if self.storage == "memory" else torch.device("cpu")
        )
        self.rows.copy_(rows.to(self.rows.device))

    def close(self) -> None:
        if self.path is not None:
            self.rows = None
            self._memmap = None
            self.path.unlink(missing_ok=True)
            self.path = None
