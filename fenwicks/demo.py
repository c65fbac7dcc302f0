"""`python -m fenwicks demo`. Until the tutorials issue lands it prints `fw.info()`."""


def run(epochs=None, batch_size=None, work_dir=None) -> int:
    import fenwicks as fw

    fw.info()
    return 0
