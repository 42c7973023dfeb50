import re


def grade(task, answer):
    """Full reward for the right final number, partial reward for a close one."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", answer)
    if not numbers:
        return {"reward": 0.0, "success": False}
    expected = task["grader"]["answer"]
    error = abs(float(numbers[-1]) - expected) / max(abs(expected), 1)
    return {"reward": max(0.0, 1.0 - error), "success": error == 0}
