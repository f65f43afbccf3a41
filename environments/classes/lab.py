"""A lab notebook: reagent stock, samples and protocol steps."""


class LabNotebook:
    """A wet-lab notebook: reagent stock (ml), samples, and protocol runs step by step."""

    def __init__(self, reagents=None, samples=None, protocols=None):
        self.reagents = dict(reagents or {"buffer": 500, "ethanol": 200, "enzyme": 5})
        self.samples = {sid: dict(s) for sid, s in (samples or {
            "S1": {"volume": 10, "status": "raw", "log": []},
            "S2": {"volume": 20, "status": "raw", "log": []}}).items()}
        self.protocols = dict(protocols or {
            "wash": [["buffer", 50], ["ethanol", 20]],
            "digest": [["buffer", 10], ["enzyme", 1]]})

    def inventory(self) -> str:
        """Reagent stock in ml."""
        return "\n".join(f"{k}: {v} ml" for k, v in sorted(self.reagents.items()))

    def sample_info(self, sample_id: str) -> str:
        """Volume, status and log of a sample.

        Args:
            sample_id: Sample id, e.g. 'S1'.
        """
        s = self._sample(sample_id)
        return f"{sample_id}: {s['volume']} ul, status {s['status']}, log: {'; '.join(s['log']) or 'empty'}"

    def _sample(self, sample_id):
        if sample_id not in self.samples:
            raise KeyError(f"no sample {sample_id!r}")
        return self.samples[sample_id]

    def register_sample(self, sample_id: str, volume: int) -> str:
        """Register a new raw sample.

        Args:
            sample_id: New sample id.
            volume: Volume in microlitres (1 to 100).
        """
        if sample_id in self.samples or not 1 <= volume <= 100:
            raise ValueError("sample exists or volume out of 1..100")
        self.samples[sample_id] = {"volume": volume, "status": "raw", "log": []}
        return f"registered {sample_id}"

    def run_protocol(self, protocol: str, sample_id: str) -> str:
        """Run every step of a protocol on a sample, consuming reagents.

        Args:
            protocol: Protocol name, e.g. 'wash'.
            sample_id: Sample id.
        """
        if protocol not in self.protocols:
            raise KeyError(f"no protocol {protocol!r}")
        s = self._sample(sample_id)
        if s["status"] == "discarded":
            raise ValueError(f"{sample_id} was discarded")
        for reagent, ml in self.protocols[protocol]:
            if self.reagents.get(reagent, 0) < ml:
                raise ValueError(f"not enough {reagent}: need {ml} ml")
        for reagent, ml in self.protocols[protocol]:
            self.reagents[reagent] -= ml
        s["log"].append(protocol)
        s["status"] = "processed"
        return f"ran {protocol} on {sample_id}"

    def restock(self, reagent: str, ml: int) -> str:
        """Add stock of a reagent.

        Args:
            reagent: Reagent name.
            ml: Millilitres to add (1 to 1000).
        """
        if not 1 <= ml <= 1000:
            raise ValueError("restock 1 to 1000 ml")
        self.reagents[reagent] = self.reagents.get(reagent, 0) + ml
        return f"{reagent}: {self.reagents[reagent]} ml"

    def aliquot(self, sample_id: str, new_id: str, volume: int) -> str:
        """Split part of a sample into a new sample.

        Args:
            sample_id: Source sample.
            new_id: Id of the new sample.
            volume: Microlitres to move (less than the source's volume).
        """
        s = self._sample(sample_id)
        if new_id in self.samples or not 1 <= volume < s["volume"]:
            raise ValueError("new id exists or volume out of range")
        s["volume"] -= volume
        self.samples[new_id] = {"volume": volume, "status": s["status"], "log": list(s["log"])}
        return f"aliquoted {volume} ul of {sample_id} into {new_id}"

    def discard(self, sample_id: str) -> str:
        """Discard a sample.

        Args:
            sample_id: Sample id.
        """
        s = self._sample(sample_id)
        if s["status"] == "discarded":
            raise ValueError("already discarded")
        s["status"] = "discarded"
        return f"discarded {sample_id}"
