"""Accelerator benchmark. (Being built: benchmark issue.)"""


def main(json_output: bool = False, n: int | None = None, repeats: int | None = None) -> int:
    raise NotImplementedError("fw.bench is being built (benchmark issue)")
