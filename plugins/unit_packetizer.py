"""The default ``PcmAppendBuffer``: whole model units out of arbitrary appends.

Audio is kept as raw little-endian bytes of one sample format at the model's
rate. Units leave the buffer as reservations; a reservation commits when the
engine took its plan and rolls back (bytes back in front, in wire order) when
it did not. Reservations settle oldest first.
"""

from __future__ import annotations

from collections import deque

from duplex_agent.plugins.contract import PcmAppendBuffer, PcmAppendReservation


class UnitReservation(PcmAppendReservation):
    def __init__(
        self, owner: UnitPacketizer, operation_id: str, data: bytes, payload: dict[str, object], padding: int
    ) -> None:
        self._owner = owner
        self._data = data
        self._padding = padding
        self._active = True
        self.operation_id = operation_id
        self.payload = payload

    @property
    def active(self) -> bool:
        return self._active

    @property
    def byte_count(self) -> int:
        return len(self._data)

    def commit(self) -> None:
        self._owner._settle_commit(self)

    def rollback(self) -> None:
        self._owner._settle_rollback(self)


class UnitPacketizer(PcmAppendBuffer):
    """Emits audio in whole units of ``unit_samples`` samples of ``sample_width`` bytes."""

    def __init__(self, *, unit_samples: int, sample_rate: int, sample_width: int = 4) -> None:
        if unit_samples <= 0 or sample_rate <= 0 or sample_width <= 0:
            raise ValueError("unit_samples, sample_rate and sample_width must be positive")
        self.unit_samples = unit_samples
        self.sample_rate = sample_rate
        self.sample_width = sample_width
        self.unit_bytes = unit_samples * sample_width
        self._pending = bytearray()
        self._reserved: deque[UnitReservation] = deque()
        self._force_listen = False

    @property
    def pending_byte_count(self) -> int:
        return len(self._pending) + sum(r.byte_count for r in self._reserved)

    def has_pending(self) -> bool:
        return bool(self._pending)

    def has_reserved(self) -> bool:
        return bool(self._reserved)

    def clear(self) -> None:
        """Drop buffered audio; in-flight reservations settle as no-ops."""
        self._pending.clear()
        for reservation in self._reserved:
            reservation._active = False
        self._reserved.clear()

    def clear_force_listen(self) -> None:
        """Clear, and mark the next unit so the model is held in listening."""
        self.clear()
        self._force_listen = True

    def prepare_append(
        self,
        payload: dict[str, object],
        *,
        operation_id: str,
        chunk_period_ms: int,
        allow_emit: bool,
    ) -> UnitReservation | None:
        audio = payload.get("audio", b"")
        if not isinstance(audio, bytes | bytearray):
            raise TypeError("append payload 'audio' must be bytes")
        if len(audio) % self.sample_width:
            raise ValueError(f"append of {len(audio)} bytes is not whole {self.sample_width}-byte samples")
        self._pending += audio
        whole = len(self._pending) // self.unit_bytes * self.unit_bytes
        if not allow_emit or whole == 0:
            return None
        return self._reserve(operation_id, whole, padded=0)

    def prepare_commit(self, *, operation_id: str, chunk_period_ms: int) -> UnitReservation:
        """Reserve everything buffered, padded with silence to a whole unit."""
        residual = len(self._pending) % self.unit_bytes
        padding = (self.unit_bytes - residual) % self.unit_bytes
        self._pending += bytes(padding)
        return self._reserve(operation_id, len(self._pending), padded=padding)

    def flush(self, *, chunk_period_ms: int) -> dict[str, object] | None:
        """Take the residual as one padded unit without a reservation, or None."""
        if not self._pending:
            return None
        padding = (self.unit_bytes - len(self._pending) % self.unit_bytes) % self.unit_bytes
        data = bytes(self._pending) + bytes(padding)
        self._pending.clear()
        return self._payload(data, padded=padding)

    def _reserve(self, operation_id: str, size: int, *, padded: int) -> UnitReservation:
        data = bytes(self._pending[:size])
        del self._pending[:size]
        reservation = UnitReservation(self, operation_id, data, self._payload(data, padded=padded), padded)
        self._reserved.append(reservation)
        return reservation

    def _payload(self, data: bytes, *, padded: int) -> dict[str, object]:
        payload: dict[str, object] = {
            "audio": data,
            "sample_rate": self.sample_rate,
            "units": len(data) // self.unit_bytes,
            "padded_bytes": padded,
        }
        if self._force_listen:
            payload["force_listen"] = True
            self._force_listen = False
        return payload

    def _settle_commit(self, reservation: UnitReservation) -> None:
        if not reservation.active:
            return
        if self._reserved[0] is not reservation:
            raise RuntimeError("reservations must commit in wire order")
        self._reserved.popleft()
        reservation._active = False

    def _settle_rollback(self, reservation: UnitReservation) -> None:
        """Return this reservation's bytes, and those of every later one, to the front.

        Silence padded on by a commit is not returned.
        """
        if not reservation.active:
            return
        returned = bytearray()
        while self._reserved:
            newest = self._reserved.pop()
            newest._active = False
            returned[:0] = newest._data[: len(newest._data) - newest._padding]
            if newest is reservation:
                break
        self._pending[:0] = returned
