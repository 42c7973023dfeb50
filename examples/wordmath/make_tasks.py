"""Write the wordmath tasks: grade-school word problems from templates, train and val.

    python examples/wordmath/make_tasks.py            # rewrites examples/wordmath/tasks.jsonl

Deterministic: the same seed writes the same file, byte for byte (a test checks
that the committed ``tasks.jsonl`` is what this script writes). Each template
gives ``PER_TEMPLATE`` problems with fresh numbers, the last ``VAL_PER_TEMPLATE``
of them go to ``val``, so both splits cover every kind of problem and never
share a question. Each line is ``{"id", "split", "question", "answer",
"solution"}``; ``solution`` is the arithmetic that gives ``answer`` (the agent
never sees it).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PER_TEMPLATE = 7
VAL_PER_TEMPLATE = 2

NAMES = (
    "Ava", "Ben", "Cara", "Dev", "Ella", "Finn", "Grace", "Hugo", "Iris", "Jon",
    "Kira", "Leo", "Mona", "Nico", "Olga", "Pablo", "Rosa", "Sami", "Tara", "Yusuf",
)  # fmt: skip

Problem = tuple[str, str]  # (question, solution expression)
Template = Callable[[random.Random], Problem]


def _two_names(rng: random.Random) -> tuple[str, str]:
    a, b = rng.sample(NAMES, 2)
    return a, b


def change(rng: random.Random) -> Problem:
    n, price = rng.randint(2, 9), rng.randint(2, 11)
    bill = rng.choice([b for b in (20, 50, 100) if b > n * price])
    name = rng.choice(NAMES)
    return (
        f"{name} buys {n} notebooks at ${price} each and pays with a ${bill} bill. "
        f"How many dollars of change does {name} get?",
        f"{bill} - {n} * {price}",
    )


def boxes(rng: random.Random) -> Problem:
    per_box, n_boxes = rng.choice([6, 8, 10, 12]), rng.randint(3, 12)
    pencils = per_box * n_boxes
    each = rng.choice([d for d in (1, 2, 3, 4) if pencils % d == 0 and pencils // d >= 8])
    return (
        f"A class has {pencils // each} students. Each student needs {each} pencils, and "
        f"pencils come in boxes of {per_box}. How many boxes does the class need?",
        f"{pencils // each} * {each} / {per_box}",
    )


def pages(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    per_day, days, last = rng.randint(8, 40), rng.randint(3, 12), rng.randint(1, 30)
    return (
        f"{name} reads {per_day} pages a day for {days} days, then {last} pages on the "
        f"last day. How many pages does {name} read in total?",
        f"{per_day} * {days} + {last}",
    )


def cookies(rng: random.Random) -> Problem:
    trays, per_tray, bag = rng.randint(3, 9), rng.randint(8, 24), rng.choice([4, 5, 6])
    total = trays * per_tray
    burnt = total % bag + bag * rng.randint(0, 2)
    burnt = burnt or bag
    return (
        f"A baker makes {trays} trays of {per_tray} cookies. {burnt} cookies burn and are "
        f"thrown away. The rest are packed into bags of {bag}. How many bags are filled?",
        f"({trays} * {per_tray} - {burnt}) / {bag}",
    )


def trip(rng: random.Random) -> Problem:
    s1, h1, s2, h2 = rng.randint(40, 90), rng.randint(2, 5), rng.randint(30, 80), rng.randint(1, 4)
    return (
        f"A train travels at {s1} km per hour for {h1} hours, then at {s2} km per hour "
        f"for {h2} hours. How many kilometers does it travel in all?",
        f"{s1} * {h1} + {s2} * {h2}",
    )


def wages(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    rate, hours, weeks = rng.randint(9, 25), rng.randint(5, 20), rng.randint(2, 6)
    return (
        f"{name} earns ${rate} per hour and works {hours} hours a week. "
        f"How many dollars does {name} earn in {weeks} weeks?",
        f"{rate} * {hours} * {weeks}",
    )


def fence(rng: random.Random) -> Problem:
    length, width = rng.randint(8, 60), rng.randint(4, 40)
    return (
        f"A garden is {length} meters long and {width} meters wide. A fence goes all the "
        f"way around it. How many meters of fence are needed?",
        f"2 * ({length} + {width})",
    )


def tickets(rng: random.Random) -> Problem:
    adult, child = rng.randint(9, 20), rng.randint(3, 8)
    adults, children = rng.randint(1, 4), rng.randint(1, 5)
    return (
        f"Museum tickets cost ${adult} for adults and ${child} for children. A family buys "
        f"{adults} adult tickets and {children} child tickets. How many dollars do they pay?",
        f"{adult} * {adults} + {child} * {children}",
    )


def half_spent(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    money = 2 * rng.randint(20, 90)
    lunch = rng.randint(3, money // 2 - 1)
    return (
        f"{name} had ${money}. {name} spent half of it on a game and then ${lunch} on "
        f"lunch. How many dollars does {name} have left?",
        f"{money} / 2 - {lunch}",
    )


def legs(rng: random.Random) -> Problem:
    cows, hens = rng.randint(3, 40), rng.randint(5, 60)
    return (
        f"A farm has {cows} cows and {hens} chickens. How many legs do these animals "
        f"have in total?",
        f"4 * {cows} + 2 * {hens}",
    )


def apples(rng: random.Random) -> Problem:
    first, second = _two_names(rng)
    total = 3 * rng.randint(6, 40)
    taken = rng.randint(1, 2 * total // 3 - 1)
    return (
        f"There are {total} apples in a basket. {first} takes a third of them, and "
        f"{second} takes {taken} of the rest. How many apples are left in the basket?",
        f"{total} - {total} / 3 - {taken}",
    )


def sale(rng: random.Random) -> Problem:
    percent = rng.choice([10, 20, 25, 50])
    price = rng.randint(2, 30) * {10: 10, 20: 5, 25: 4, 50: 2}[percent]
    return (
        f"A jacket costs ${price}. It is on sale for {percent} percent off. "
        f"What is the sale price in dollars?",
        f"{price} - {price} * {percent} / 100",
    )


def savings(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    weekly, weeks = rng.randint(4, 25), rng.randint(3, 20)
    return (
        f"{name} saves ${weekly} every week. How many weeks does it take {name} to save "
        f"${weekly * weeks}?",
        f"{weekly * weeks} / {weekly}",
    )


def pool(rng: random.Random) -> Problem:
    rate, minutes = rng.randint(5, 40), rng.randint(10, 90)
    already = rng.randint(1, 20) * 10
    return (
        f"A pool already holds {already} liters of water. A hose adds {rate} liters per "
        f"minute until the pool holds {already + rate * minutes} liters. "
        f"How many minutes does that take?",
        f"({already + rate * minutes} - {already}) / {rate}",
    )


def ages(rng: random.Random) -> Problem:
    first, second = _two_names(rng)
    age, gap = rng.randint(4, 15), rng.randint(2, 9)
    return (
        f"{first} is {age} years old. {second} is {gap} years older than {first}. "
        f"Their aunt is twice as old as {second}. How old is their aunt?",
        f"2 * ({age} + {gap})",
    )


TEMPLATES: tuple[Template, ...] = (
    change, boxes, pages, cookies, trip, wages, fence, tickets,
    half_spent, legs, apples, sale, savings, pool, ages,
)  # fmt: skip


def evaluate(expression: str) -> int | float:
    """The value of a solution expression (numbers, + - * / and parentheses only)."""
    from tether.starter.calc import safe_eval

    return safe_eval(expression)


def make_tasks(seed: int = 0) -> list[dict[str, Any]]:
    """Every task, train first then val, the same list for the same ``seed``."""
    rng = random.Random(f"tether-wordmath:{seed}")
    train: list[dict[str, Any]] = []
    val: list[dict[str, Any]] = []
    seen: set[str] = set()
    for template in TEMPLATES:
        made = 0
        while made < PER_TEMPLATE:
            question, solution = template(rng)
            if question in seen:
                continue
            seen.add(question)
            value = evaluate(solution)
            if value < 0 or (isinstance(value, float) and not value.is_integer()):
                raise AssertionError(f"{template.__name__} made {solution} = {value}")
            split, out = (
                ("val", val) if made >= PER_TEMPLATE - VAL_PER_TEMPLATE else ("train", train)
            )
            task_id = f"wordmath-{split}-{template.__name__}-{made}"
            out.append(
                {
                    "id": task_id,
                    "split": split,
                    "question": question,
                    "answer": int(value),
                    "solution": solution,
                }
            )
            made += 1
    return train + val


def write_tasks(path: Path, seed: int = 0) -> int:
    tasks = make_tasks(seed)
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return len(tasks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "tasks.jsonl")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{write_tasks(args.out, args.seed)} tasks -> {args.out}")


if __name__ == "__main__":
    main()
