// A JDBC client of `floe serve`, as DBeaver and other JDBC tools are: it reads the server's
// metadata (catalogs, schemas, tables, columns) the way pgjdbc's DatabaseMetaData asks for it,
// runs a prepared statement past pgjdbc's prepareThreshold (so a named server-side statement is
// reused), and an error. It prints one tab-separated line per fact; test_server.py checks them.
//
// Run: java -cp postgresql.jar FloeJdbc.java 'jdbc:postgresql://127.0.0.1:PORT/lake?user=floe'
import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.sql.Statement;

public class FloeJdbc {
    public static void main(String[] args) throws Exception {
        try (Connection c = DriverManager.getConnection(args[0])) {
            DatabaseMetaData md = c.getMetaData();
            out("product", md.getDatabaseProductName(), md.getDatabaseProductVersion());
            try (ResultSet rs = md.getCatalogs()) {
                while (rs.next()) out("catalog", rs.getString("TABLE_CAT"));
            }
            try (ResultSet rs = md.getSchemas()) {
                while (rs.next()) out("schema", rs.getString("TABLE_SCHEM"));
            }
            try (ResultSet rs = md.getTables(null, "shop", "%", new String[] {"TABLE"})) {
                while (rs.next()) {
                    out("table", rs.getString("TABLE_SCHEM"), rs.getString("TABLE_NAME"),
                        rs.getString("TABLE_TYPE"));
                }
            }
            try (ResultSet rs = md.getColumns(null, "shop", "orders", "%")) {
                while (rs.next()) {
                    out("column", rs.getString("COLUMN_NAME"), rs.getString("TYPE_NAME"),
                        String.valueOf(rs.getInt("DATA_TYPE")), rs.getString("IS_NULLABLE"),
                        String.valueOf(rs.getInt("ORDINAL_POSITION")));
                }
            }
            String sql = "SELECT id, customer, amount FROM shop.orders "
                + "WHERE id >= ? AND customer <> ? ORDER BY id";
            try (PreparedStatement ps = c.prepareStatement(sql)) {
                for (int round = 0; round < 7; round++) {
                    ps.setLong(1, 1);
                    ps.setString(2, "nobody");
                    try (ResultSet rs = ps.executeQuery()) {
                        ResultSetMetaData m = rs.getMetaData();
                        if (round == 0) {
                            for (int i = 1; i <= m.getColumnCount(); i++) {
                                out("result_column", m.getColumnName(i), m.getColumnTypeName(i));
                            }
                        }
                        while (rs.next()) {
                            if (round == 6) {
                                out("row", String.valueOf(rs.getLong(1)), rs.getString(2),
                                    rs.getBigDecimal(3).toPlainString());
                            }
                        }
                    }
                }
            }
            try (Statement s = c.createStatement()) {
                try {
                    s.executeQuery("SELECT * FROM shop.nope");
                    out("error", "none");
                } catch (SQLException e) {
                    out("error", e.getSQLState());
                }
                try (ResultSet rs = s.executeQuery("SELECT count(*) FROM shop.orders")) {
                    rs.next();
                    out("count", String.valueOf(rs.getLong(1)));
                }
                // floe's own statements: DDL, and one whose rows only running it tells.
                s.executeUpdate("CREATE SCHEMA lake.jdbc");
                try (ResultSet rs = s.executeQuery("SHOW SCHEMAS IN lake")) {
                    while (rs.next()) out("floe_schema", rs.getString("schema_name"));
                }
            }
            try (PreparedStatement ps = c.prepareStatement("SHOW TABLES IN lake.shop")) {
                ResultSetMetaData m = ps.getMetaData();
                out("show_described", String.valueOf(m == null ? 0 : m.getColumnCount()));
                try (ResultSet rs = ps.executeQuery()) {
                    while (rs.next()) out("show_row", rs.getString(rs.findColumn("table_name")));
                }
            }
        }
    }

    static void out(String... fields) {
        System.out.println(String.join("\t", fields));
    }
}
