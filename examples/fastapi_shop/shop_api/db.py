"""The shop's data: SQLAlchemy 2 on PostgreSQL through psycopg 3 (``SHOP_DATABASE_URL``)."""

import os

from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

DATABASE_URL = os.environ.get("SHOP_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1/shop")

engine = create_engine(DATABASE_URL)
Session = sessionmaker(engine)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    total_cents: Mapped[int]
    receipt_sent: Mapped[bool] = mapped_column(default=False)
