-- outboxkit store/mysql schema, version 3: paused topics and groups
-- (outbox.Admin). A row pauses pause_topic; pause_grp '' means every group
-- of it, pause_tenant '' every tenant. The claim skips what a row covers.
-- {{prefix}} is replaced by Options.TablePrefix. Idempotent (IF NOT
-- EXISTS), like every migration here.

CREATE TABLE IF NOT EXISTS {{prefix}}pauses (
    pause_topic  VARBINARY(255) NOT NULL,
    pause_grp    VARBINARY(255) NOT NULL DEFAULT '',
    pause_tenant VARBINARY(255) NOT NULL DEFAULT '',
    created_at   DATETIME(6)    NOT NULL,
    PRIMARY KEY (pause_topic, pause_grp, pause_tenant)
) ENGINE = InnoDB;
