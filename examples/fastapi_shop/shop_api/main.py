"""The HTTP API: ``uvicorn shop_api.main:api``."""

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel, PositiveInt
from sqlalchemy.orm import Session as SqlSession

from shop_api.db import Base, Order, Session, engine
from shop_api.tasks import app, send_receipt


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    Base.metadata.create_all(engine)
    yield


api = FastAPI(lifespan=lifespan)


def session() -> Iterator[SqlSession]:
    with Session() as s:
        yield s


class NewOrder(BaseModel):
    total_cents: PositiveInt
    coupon: str | None = None


@api.post("/orders", status_code=201)
def create_order(new: NewOrder, db: Annotated[SqlSession, Depends(session)]) -> dict[str, int]:
    # The order and its receipt task: both committed, or neither.
    with app.transaction(db):
        order = Order(total_cents=new.total_cents)
        db.add(order)
        db.flush()  # the order's id
        send_receipt.delay(order.id)
    if new.coupon is not None and new.coupon != "WELCOME":
        db.rollback()  # no order, and no receipt task either
        raise HTTPException(400, f"unknown coupon {new.coupon!r}")
    db.commit()
    return {"id": order.id}
