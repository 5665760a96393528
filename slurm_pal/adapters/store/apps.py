"""Applications, their classes (fitted or an admin's override) and the classifier models."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_pal.adapters.store.schema import StoreConnection, StoreError, now_utc
from slurm_pal.core.features import UtilizationFeatures


@dataclass(frozen=True)
class Application:
    """A profiled (or admin-declared) application and its class.

    ``features`` is None for an application an admin declared with ``apps set`` without
    profiling it; ``job_class`` is None until a classifier model exists (``apps fit``);
    ``class_origin`` is "fit" (the model's label) or "admin" (an override, kept by refits).
    """

    name: str
    features: UtilizationFeatures | None
    files: tuple[dict[str, str], ...]
    job_class: str | None
    class_origin: str | None
    model_id: int | None
    updated_at: str

    @property
    def dram_util(self) -> float | None:
        return None if self.features is None else self.features.dram_util

    @property
    def fu_util(self) -> float | None:
        return None if self.features is None else self.features.fu_util


@dataclass(frozen=True)
class ClassifierModel:
    id: int
    created_at: str
    model: dict[str, object]
    n_apps: int


class AppStore(StoreConnection):
    """Applications and classifier models."""

    def save_application(
        self,
        name: str,
        features: UtilizationFeatures,
        *,
        files: Sequence[dict[str, str]] = (),
        predicted_class: str | None = None,
        model_id: int | None = None,
    ) -> Application:
        """Store an application's measured features and its class under ``model_id``.

        Replaces earlier features of the same name. An admin override stays as it is: the
        new measurement is kept, the admin's class is not replaced by the model's.
        """
        now = now_utc()
        with self._write() as db:
            row = db.execute(
                "SELECT class, class_origin, model_id FROM applications WHERE name = ?", (name,)
            ).fetchone()
            if row is not None and row[1] == "admin":
                job_class, origin, model = row[0], "admin", row[2]
            elif predicted_class is not None:
                job_class, origin, model = predicted_class, "fit", model_id
            else:
                job_class, origin, model = None, None, None
            db.execute(
                "INSERT OR REPLACE INTO applications (name, dram_util, fu_util, source, "
                "fu_source, features, files, class, class_origin, model_id, updated_at) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    name,
                    features.dram_util,
                    features.fu_util,
                    features.source,
                    features.fu_source,
                    json.dumps(features.to_dict()),
                    json.dumps(list(files)),
                    job_class,
                    origin,
                    model,
                    now,
                ),
            )
        app = self.application(name)
        assert app is not None
        return app

    def set_application_class(self, name: str, job_class: str) -> Application:
        """Admin override: ``name`` is ``job_class`` whatever the model says (creates it if new).

        The caller checks ``job_class`` against the site's class names.
        """
        now = now_utc()
        with self._write() as db:
            updated = db.execute(
                "UPDATE applications SET class = ?, class_origin = 'admin', updated_at = ? "
                "WHERE name = ?",
                (job_class, now, name),
            ).rowcount
            if not updated:
                db.execute(
                    "INSERT INTO applications (name, class, class_origin, updated_at) "
                    "VALUES (?, ?, 'admin', ?)",
                    (name, job_class, now),
                )
        app = self.application(name)
        assert app is not None
        return app

    def clear_application_override(
        self, name: str, *, predicted_class: str | None, model_id: int | None
    ) -> Application:
        """Undo an admin override: the class goes back to the model's (None without one).

        An application that exists only because of the override (no features) is removed.
        """
        with self._write() as db:
            row = db.execute(
                "SELECT class_origin, features FROM applications WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                raise StoreError(self._unknown_app_message(name))
            if row[0] != "admin":
                raise StoreError(f"application {name!r} has no admin override to clear")
            if row[1] is None:
                db.execute("DELETE FROM applications WHERE name = ?", (name,))
            else:
                origin = None if predicted_class is None else "fit"
                db.execute(
                    "UPDATE applications SET class = ?, class_origin = ?, model_id = ?, "
                    "updated_at = ? WHERE name = ?",
                    (predicted_class, origin, model_id if origin else None, now_utc(), name),
                )
        app = self.application(name)
        return app if app is not None else Application(name, None, (), None, None, None, now_utc())

    def application(self, name: str) -> Application | None:
        rows = self._application_rows("WHERE name = ?", (name,))
        return rows[0] if rows else None

    def applications(self) -> list[Application]:
        """All applications, by name."""
        return self._application_rows("", ())

    def _application_rows(self, where: str, params: tuple[object, ...]) -> list[Application]:
        rows = self._db.execute(
            "SELECT name, features, files, class, class_origin, model_id, updated_at "
            f"FROM applications {where} ORDER BY name",
            params,
        ).fetchall()
        return [
            Application(
                name=r[0],
                features=None if r[1] is None else UtilizationFeatures.from_dict(json.loads(r[1])),
                files=tuple(json.loads(r[2])),
                job_class=r[3],
                class_origin=r[4],
                model_id=r[5],
                updated_at=r[6],
            )
            for r in rows
        ]

    def _unknown_app_message(self, name: str) -> str:
        known = [r[0] for r in self._db.execute("SELECT name FROM applications ORDER BY name")]
        return f"no application {name!r} in {self.path}; known: {', '.join(known) or 'none yet'}"

    def save_classifier(
        self, model: dict[str, object], labels: dict[str, str], *, n_apps: int
    ) -> int:
        """Store a fitted model as the active one and label the applications with it.

        ``labels`` maps application -> class; admin overrides are left as they are. One
        transaction: the new model and every new label land together, or nothing does.
        """
        with self._write() as db:
            db.execute("UPDATE classifier_models SET active = 0 WHERE active = 1")
            cursor = db.execute(
                "INSERT INTO classifier_models (created_at, active, model, n_apps) "
                "VALUES (?, 1, ?, ?)",
                (now_utc(), json.dumps(model), n_apps),
            )
            model_id = int(cursor.lastrowid or 0)
            now = now_utc()
            for name, job_class in labels.items():
                changed = db.execute(
                    "UPDATE applications SET class = ?, class_origin = 'fit', model_id = ?, "
                    "updated_at = ? WHERE name = ? AND features IS NOT NULL "
                    "AND (class_origin IS NULL OR class_origin = 'fit')",
                    (job_class, model_id, now, name),
                ).rowcount
                if not changed and self.application(name) is None:
                    raise StoreError(self._unknown_app_message(name))
        return model_id

    def active_classifier(self) -> ClassifierModel | None:
        """The model new applications are classified with (None before the first fit)."""
        row = self._db.execute(
            "SELECT id, created_at, model, n_apps FROM classifier_models WHERE active = 1"
        ).fetchone()
        if row is None:
            return None
        return ClassifierModel(
            id=row[0], created_at=row[1], model=json.loads(row[2]), n_apps=row[3]
        )
