"""Write the search task's made-up document collection and its questions.

    python examples/search/make_tasks.py     # rewrites docs.jsonl and tasks.jsonl here

The documents describe an invented archipelago (the Tessaly Isles): islands,
towns, people, companies and landmarks, with names made from syllables, so no
model knows the answers beforehand and every answer is in a document. Each
question says which documents hold its answer (``docs``, two for the
two-hop questions). Deterministic: the same seed writes the same files byte
for byte (a test checks the committed files).

``docs.jsonl``: ``{"id", "title", "text"}``. ``tasks.jsonl``: ``{"id",
"split", "question", "answers", "docs"}``; ``answers`` lists the accepted
forms of the answer, the first one canonical.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VAL_FRACTION = 0.25

_SYLLABLES = (
    "bra", "cor", "del", "fen", "gal", "hol", "ith", "jor", "kel", "lum", "mar", "nev",
    "ost", "pel", "quin", "ros", "sol", "tam", "ur", "vex", "wyn", "zar", "dro", "mir",
)  # fmt: skip
_FIRST = (
    "Ilsa", "Tomas", "Wren", "Odile", "Bastian", "Mira", "Corin", "Petra", "Anselm", "Lyra",
    "Edvin", "Sunniva", "Haldor", "Rhea", "Kasimir", "Ysolde", "Per", "Ines", "Magnus", "Talia",
)  # fmt: skip
_MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August",
    "September", "October", "November", "December",
)  # fmt: skip
_PRODUCTS = (
    "glass floats", "salt cod", "wool blankets", "copper kettles", "rope", "lamp oil",
    "pottery", "smoked eel", "sailcloth", "cider", "clay pipes", "seaweed soap",
    "barrel hoops", "tide clocks", "oyster knives", "slate tiles",
)  # fmt: skip
_FESTIVALS = (
    "Lantern", "Herring", "Kite", "Bonfire", "Moss", "Bell", "Tide", "Harvest",
    "Mask", "Salt", "Ribbon", "Star", "Drum", "Honey", "Frost", "Boat",
)  # fmt: skip
_INVENTIONS = (
    "the folding oar", "the storm barometer", "the cork life vest", "the brass sextant lamp",
    "the tide table wheel", "the peat stove", "the rope-braiding loom", "the fog whistle",
    "the net-mending clamp", "the salt evaporation pan", "the glass buoy mould",
    "the signal mirror", "the herring smokehouse vent", "the keel scraper",
    "the kelp press", "the lighthouse clockwork",
)  # fmt: skip
_JOBS = (
    "shipwright", "chemist", "clockmaker", "cartographer", "glassblower", "engineer",
    "weaver", "surveyor",
)  # fmt: skip
_ANIMALS = (
    "puffin", "otter", "seal", "heron", "crab", "gull", "badger", "fox",
    "hare", "cormorant", "stoat", "tern", "owl", "lobster",
)  # fmt: skip
_COMPANY_KINDS = (
    ("Lamps", "ship lanterns"), ("Ropeworks", "mooring ropes"), ("Kettles", "copper kettles"),
    ("Boats", "fishing dinghies"), ("Printing", "sea charts"), ("Canning", "tinned mackerel"),
    ("Bells", "harbour bells"), ("Looms", "weaving looms"), ("Clocks", "tide clocks"),
    ("Soap", "seaweed soap"), ("Glass", "bottle glass"), ("Tiles", "roof tiles"),
    ("Compasses", "pocket compasses"), ("Sails", "canvas sails"),
)  # fmt: skip


class _Names:
    """Unique made-up names from syllables."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int = 2) -> str:
        while True:
            name = "".join(self.rng.choice(_SYLLABLES) for _ in range(syllables)).capitalize()
            if name not in self.used:
                self.used.add(name)
                return name


@dataclass
class _World:
    docs: list[dict[str, str]] = field(default_factory=list)
    questions: list[dict[str, Any]] = field(default_factory=list)

    def doc(self, kind: str, title: str, text: str) -> str:
        doc_id = f"{kind}-{sum(d['id'].startswith(kind) for d in self.docs):02d}"
        self.docs.append({"id": doc_id, "title": title, "text": text})
        return doc_id

    def ask(self, question: str, answers: list[str], docs: list[str]) -> None:
        self.questions.append({"question": question, "answers": answers, "docs": docs})


def build_world(seed: int = 0) -> _World:
    """Every document and question of the collection."""
    rng = random.Random(f"tether-search:{seed}")
    names = _Names(rng)
    w = _World()

    islands = []
    for _ in range(4):
        name, area = names.word(), rng.randint(40, 400)
        doc = w.doc(
            "island",
            f"{name} Island",
            f"{name} is one of the four main islands of the Tessaly Isles. It covers "
            f"{area} square kilometers and its ferries sail from the harbour at its "
            f"southern tip.",
        )
        islands.append((name, doc))
        w.ask(f"How many square kilometers does {name} Island cover?", [str(area)], [doc])

    people = [f"{first} {names.word()}" for first in rng.sample(_FIRST, 16)]
    births = [rng.randint(1790, 1930) for _ in people]
    towns = []
    for i in range(16):
        town, (island, _) = names.word(), islands[i % 4]
        founded, founder = rng.randint(1380, 1790), f"{rng.choice(_FIRST)} {names.word()}"
        festival, month = f"{_FESTIVALS[i]} Festival", rng.choice(_MONTHS)
        product = _PRODUCTS[i]
        doc = w.doc(
            "town",
            town,
            f"{town} is a harbour town on {island} Island, founded in {founded} by "
            f"{founder}. Every {month} it holds the {festival}. {town} is known for its "
            f"{product}.",
        )
        towns.append((town, doc, month, founded))
        w.ask(f"In what year was the town of {town} founded?", [str(founded)], [doc])
        w.ask(f"What is the town of {town} known for making?", [product], [doc])
        if i % 2:
            w.ask(f"In which month does {town} hold the {festival}?", [month], [doc])
        else:
            w.ask(f"Who founded the town of {town}?", [founder], [doc])

    for i, person in enumerate(people):
        town, town_doc, month, founded = towns[(i * 7 + 3) % 16]
        born, job, invention = births[i], _JOBS[i % 8], _INVENTIONS[i]
        doc = w.doc(
            "person",
            person,
            f"{person} was a {job} born in {town} in {born}. {person.split()[0]} is best "
            f"remembered for {invention}, first shown at the island fair in {born + 31}.",
        )
        w.ask(f"In which town was {person} born?", [town], [doc])
        w.ask(f"What is {person} best remembered for?", [invention], [doc])
        if i % 2 == 0:
            w.ask(
                f"In which month is the festival of the town where {person} was born?",
                [month],
                [doc, town_doc],
            )
        else:
            w.ask(
                f"In what year was the hometown of {person} founded?",
                [str(founded)],
                [doc, town_doc],
            )

    for i, (suffix, product) in enumerate(_COMPANY_KINDS):
        company = f"{names.word()} {suffix}"
        town, _, _, _ = towns[(i * 3 + 1) % 16]
        who = (i * 3 + 2) % 16
        founder, started = people[who], births[who] + rng.randint(24, 50)
        staff, mascot = rng.randint(12, 900), _ANIMALS[i]
        doc = w.doc(
            "company",
            company,
            f"{company} makes {product} in {town}. It was started in {started} by "
            f"{founder} and employs {staff} people. Its mascot is a {mascot}.",
        )
        w.ask(f"What animal is the mascot of {company}?", [mascot, f"a {mascot}"], [doc])
        w.ask(f"How many people does {company} employ?", [str(staff)], [doc])
        w.ask(f"What does {company} make?", [product], [doc])

    for i in range(12):
        island, _ = islands[i % 4]
        name = names.word(3)
        if i % 3 == 0:
            height = rng.randint(300, 2400)
            doc = w.doc(
                "landmark",
                f"Mount {name}",
                f"Mount {name} rises {height} meters above the sea on {island} Island. "
                f"Shepherds graze sheep on its lower slopes.",
            )
            w.ask(
                f"How tall is Mount {name}?",
                [f"{height} meters", f"{height} m", str(height)],
                [doc],
            )
        elif i % 3 == 1:
            depth = rng.randint(8, 160)
            doc = w.doc(
                "landmark",
                f"Lake {name}",
                f"Lake {name} is a freshwater lake on {island} Island, {depth} meters deep "
                f"at its deepest point. Its water supplies the nearby towns.",
            )
            w.ask(f"How deep is Lake {name}?", [f"{depth} meters", f"{depth} m", str(depth)], [doc])
        else:
            lit = rng.randint(1780, 1950)
            doc = w.doc(
                "landmark",
                f"{name} Light",
                f"{name} Light is a lighthouse on the north cape of {island} Island. It was "
                f"first lit in {lit} and its lamp can be seen from {rng.randint(12, 40)} "
                f"kilometers away.",
            )
            w.ask(f"In what year was {name} Light first lit?", [str(lit)], [doc])
            w.ask(f"On which island is {name} Light?", [island, f"{island} Island"], [doc])
    return w


def make_data(seed: int = 0) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """(docs, tasks): tasks train first then val; one question in four goes to val."""
    world = build_world(seed)
    rng = random.Random(f"tether-search-split:{seed}")
    order = list(range(len(world.questions)))
    rng.shuffle(order)
    n_val = round(len(order) * VAL_FRACTION)
    val = set(order[:n_val])
    tasks: list[dict[str, Any]] = []
    for split in ("train", "val"):
        for i, q in enumerate(world.questions):
            if (i in val) == (split == "val"):
                tasks.append({"id": f"search-{split}-{i:03d}", "split": split, **q})
    return world.docs, tasks


def write_data(out: Path, seed: int = 0) -> tuple[int, int]:
    docs, tasks = make_data(seed)
    (out / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (out / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return len(docs), len(tasks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n_docs, n_tasks = write_data(args.out, args.seed)
    print(f"{n_docs} docs, {n_tasks} tasks -> {args.out}")


if __name__ == "__main__":
    main()
