import dataclasses
import enum


class Kind(enum.Enum):
    BOOK = "book"
    FOOD = "food"


@dataclasses.dataclass(frozen=True)
class Item:
    name: str
    kind: Kind
    cents: int


CATALOG = (
    Item("Dune", Kind.BOOK, 1299),
    Item("Brot", Kind.FOOD, 349),
    Item("Ἰλιάς", Kind.BOOK, 2500),
)
