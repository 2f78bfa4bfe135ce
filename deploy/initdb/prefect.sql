-- The Prefect server's database, next to lakeFS's in the same PostgreSQL.
CREATE DATABASE prefect OWNER tokenlake;
