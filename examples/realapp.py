"""A small real application: numpy, Flask and boto3 each doing real work.

- numpy: least-squares fit of a noisy line and an SVD of a random matrix;
- Flask: a JSON API queried through Flask's test client (no server, no port);
- boto3: an S3 client call answered by botocore's Stubber (no network).

Its stdout is deterministic, so a plain run and a pycds run can be compared
line by line.  Run it plain, then under pycds::

    PYCDSMODE=DUMP  PYCDSARCHIVE=app.img python examples/realapp.py
    PYCDSMODE=SHARE PYCDSARCHIVE=app.img python examples/realapp.py
"""

import numpy as np
import boto3
from botocore.stub import Stubber
from flask import Flask, jsonify, request


def numpy_work():
    rng = np.random.default_rng(1234)
    x = np.linspace(0.0, 10.0, 200)
    y = 3.0 * x + 2.0 + rng.normal(0.0, 0.01, x.shape)
    a = np.vstack([x, np.ones_like(x)]).T           # (200, 2)
    slope, intercept = np.linalg.lstsq(a, y, rcond=None)[0]
    s = np.linalg.svd(rng.standard_normal((8, 8)), compute_uv=False)
    return f"fit slope={slope:.3f} intercept={intercept:.3f} sv_max={s[0]:.3f}"


def make_app():
    app = Flask("realapp")
    inventory = {"apple": 3, "pear": 5}

    @app.get("/items/<name>")
    def item(name):
        if name not in inventory:
            return jsonify(error="unknown item", name=name), 404
        return jsonify(name=name, count=inventory[name])

    @app.post("/items")
    def add():
        data = request.get_json()
        inventory[data["name"]] = int(data["count"])
        return jsonify(ok=True, size=len(inventory)), 201

    return app


def flask_work():
    client = make_app().test_client()
    r1 = client.get("/items/pear")
    r2 = client.post("/items", json={"name": "fig", "count": 7})
    r3 = client.get("/items/kiwi")
    return (f"flask {r1.status_code} {r1.get_json()} | {r2.status_code} "
            f"{r2.get_json()} | {r3.status_code} {r3.get_json()}")


def boto3_work():
    s3 = boto3.client("s3", region_name="eu-west-1", aws_access_key_id="x",
                      aws_secret_access_key="y")
    with Stubber(s3) as stub:
        stub.add_response("list_buckets",
                          {"Buckets": [{"Name": "logs"}, {"Name": "models"}],
                           "Owner": {"ID": "abc"}}, {})
        names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    return f"boto3 buckets={names} service={s3.meta.service_model.service_name}"


if __name__ == "__main__":
    print(numpy_work())
    print(flask_work())
    print(boto3_work())
