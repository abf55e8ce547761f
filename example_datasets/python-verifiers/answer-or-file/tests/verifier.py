def verify(workspace, response=None):
    """An agent's final answer when it gave one; else (the oracle) the file it wrote."""
    if response is not None:
        answer = response["output_text"]
    else:
        path = workspace / "answer.txt"
        answer = path.read_text() if path.is_file() else ""
    return 1.0 if answer.strip().strip(".").lower() == "paris" else 0.0
