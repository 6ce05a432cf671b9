-- outboxkit SQLite schema, version 3: paused topics and groups
-- (outbox.Admin). A row pauses pause_topic; pause_grp '' means every group
-- of it, pause_tenant '' every tenant. The claim skips what a row covers.

CREATE TABLE {{prefix}}pauses (
    pause_topic  TEXT    NOT NULL,
    pause_grp    TEXT    NOT NULL DEFAULT '',
    pause_tenant TEXT    NOT NULL DEFAULT '',
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (pause_topic, pause_grp, pause_tenant)
);
