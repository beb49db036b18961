import asyncio
import inspect
import pickle
import sys
import traceback

import shopkit
from shopkit import pricing

print("total", pricing.total(shopkit.CATALOG))
print("gen", list(pricing.gen(5)), asyncio.run(pricing.coro(41)), pricing.closure(3)(4))
print("file", shopkit.__file__.endswith("shopkit/__init__.py"), pricing.__cached__ is not None)
print("spec", shopkit.__spec__.name, shopkit.__spec__.submodule_search_locations == shopkit.__path__,
      shopkit.__spec__.has_location, pricing.__spec__.parent)
print("loader", shopkit.__loader__.is_package("shopkit"), pricing.__loader__.get_filename("shopkit.pricing").endswith("pricing.py"))
print("source", inspect.getsource(pricing.closure).splitlines()[0])
print("pickle", pickle.loads(pickle.dumps(shopkit.CATALOG[2])) == shopkit.CATALOG[2])
print("consts", pricing.ROUNDING == frozenset({"up", "down", "even"}), pricing.VAT)
try:
    pricing.boom()
except ZeroDivisionError:
    tb = traceback.format_exc().replace(str(__import__("os").getcwd()), "<cwd>")
    print(tb)
sys.exit(3)
