//! SQL errors as MySQL clients see them: an error number, a SQLSTATE and a message. Cluster
//! errors (`ShoalError`) map onto MySQL numbers here, in one place.

use shoal_proto::{ErrorCode, ShoalError};

/// An error reported to the client as a MySQL ERR packet. The connection stays open.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("ERROR {code} ({state}): {message}")]
pub struct SqlError {
    pub code: u16,
    pub state: &'static str,
    pub message: String,
}

pub type SqlResult<T> = Result<T, SqlError>;

/// MySQL error numbers used by the SQL node (names follow MySQL's `ER_*`).
pub mod code {
    pub const DB_CREATE_EXISTS: u16 = 1007;
    pub const DB_DROP_EXISTS: u16 = 1008;
    pub const OUT_OF_SORTMEMORY: u16 = 1038;
    pub const DBACCESS_DENIED: u16 = 1044;
    pub const ACCESS_DENIED: u16 = 1045;
    pub const NO_DB: u16 = 1046;
    pub const UNKNOWN_COM: u16 = 1047;
    pub const TOO_MANY_CONNECTIONS: u16 = 1040;
    pub const BAD_NULL: u16 = 1048;
    pub const BAD_DB: u16 = 1049;
    pub const TABLE_EXISTS: u16 = 1050;
    pub const BAD_TABLE: u16 = 1051;
    pub const NON_UNIQ_ERROR: u16 = 1052;
    pub const BAD_FIELD: u16 = 1054;
    pub const TOO_LONG_IDENT: u16 = 1059;
    pub const DUP_FIELDNAME: u16 = 1060;
    pub const DUP_KEYNAME: u16 = 1061;
    pub const WRONG_NAME_FOR_INDEX: u16 = 1280;
    pub const KEY_COLUMN_DOES_NOT_EXIST: u16 = 1072;
    pub const WRONG_SUB_KEY: u16 = 1089;
    pub const TOO_MANY_KEYS: u16 = 1069;
    pub const CANT_DROP_FIELD_OR_KEY: u16 = 1091;
    pub const CANT_REMOVE_ALL_FIELDS: u16 = 1090;
    pub const TABLE_DEF_CHANGED: u16 = 1412;
    pub const DUP_ENTRY: u16 = 1062;
    pub const PARSE: u16 = 1064;
    pub const INVALID_DEFAULT: u16 = 1067;
    pub const NONUNIQ_TABLE: u16 = 1066;
    pub const MULTIPLE_PRI_KEY: u16 = 1068;
    pub const WRONG_AUTO_KEY: u16 = 1075;
    pub const UNKNOWN: u16 = 1105;
    pub const FIELD_SPECIFIED_TWICE: u16 = 1110;
    pub const INVALID_GROUP_FUNC_USE: u16 = 1111;
    pub const RECORD_FILE_FULL: u16 = 1114;
    pub const TOO_BIG_ROWSIZE: u16 = 1118;
    pub const WRONG_TABLE_NAME: u16 = 1103;
    pub const INVALID_USE_OF_NULL: u16 = 1138;
    pub const WARN_DATA_TRUNCATED: u16 = 1265;
    pub const PASSWORD_NO_MATCH: u16 = 1133;
    pub const WRONG_VALUE_COUNT_ON_ROW: u16 = 1136;
    pub const NONEXISTING_GRANT: u16 = 1141;
    pub const TABLEACCESS_DENIED: u16 = 1142;
    pub const WRONG_NUMBER_OF_COLUMNS_IN_SELECT: u16 = 1222;
    pub const NO_SUCH_TABLE: u16 = 1146;
    pub const NET_PACKET_TOO_LARGE: u16 = 1153;
    pub const UNKNOWN_SYSTEM_VARIABLE: u16 = 1193;
    pub const WRONG_VALUE_FOR_VAR: u16 = 1231;
    pub const LOCK_WAIT_TIMEOUT: u16 = 1205;
    pub const LOCK_TABLE_FULL: u16 = 1206;
    pub const LOCK_DEADLOCK: u16 = 1213;
    pub const WRONG_ARGUMENTS: u16 = 1210;
    pub const SPECIFIC_ACCESS_DENIED: u16 = 1227;
    pub const NOT_SUPPORTED_YET: u16 = 1235;
    pub const NOT_SUPPORTED_AUTH_MODE: u16 = 1251;
    pub const CANNOT_USER: u16 = 1396;
    pub const CANT_CREATE_USER_WITH_GRANT: u16 = 1410;
    pub const WRONG_STRING_LENGTH: u16 = 1470;
    pub const PLUGIN_IS_NOT_LOADED: u16 = 1524;
    pub const OPERAND_COLUMNS: u16 = 1241;
    pub const SUBQUERY_NO_1_ROW: u16 = 1242;
    pub const DERIVED_MUST_HAVE_ALIAS: u16 = 1248;
    pub const UNKNOWN_STMT_HANDLER: u16 = 1243;
    pub const WARN_DATA_OUT_OF_RANGE: u16 = 1264;
    pub const TRUNCATED_WRONG_VALUE: u16 = 1292;
    pub const GET_ERRMSG: u16 = 1296;
    pub const SP_DOES_NOT_EXIST: u16 = 1305;
    pub const WRONG_OBJECT: u16 = 1347;
    pub const VIEW_WRONG_LIST: u16 = 1353;
    pub const UNIQUE_KEY_NEED_ALL_FIELDS_IN_PF: u16 = 1503;
    pub const WINDOW_INVALID_USE: u16 = 3593;
    pub const WINDOW_NO_SUCH_WINDOW: u16 = 3579;
    pub const WINDOW_NO_INHERIT_FRAME: u16 = 3580;
    pub const WINDOW_NO_CHILD_PARTITIONING: u16 = 3581;
    pub const WINDOW_NO_REDEFINE_ORDER_BY: u16 = 3582;
    pub const WINDOW_CIRCULARITY_IN_WINDOW_GRAPH: u16 = 3583;
    pub const WINDOW_DUPLICATE_NAME: u16 = 3591;
    pub const CTE_RECURSIVE_REQUIRES_UNION: u16 = 3573;
    pub const CTE_RECURSIVE_REQUIRES_NONRECURSIVE_FIRST: u16 = 3574;
    pub const CTE_RECURSIVE_FORBIDS_AGGREGATION: u16 = 3575;
    pub const CTE_RECURSIVE_REQUIRES_SINGLE_REFERENCE: u16 = 3577;
    pub const CTE_MAX_RECURSION_DEPTH: u16 = 3636;
    pub const NO_DEFAULT_FOR_FIELD: u16 = 1364;
    pub const TRUNCATED_WRONG_VALUE_FOR_FIELD: u16 = 1366;
    pub const DATA_TOO_LONG: u16 = 1406;
    pub const WRONG_PARAMCOUNT_TO_NATIVE_FCT: u16 = 1582;
    pub const DATA_OUT_OF_RANGE: u16 = 1690;
    pub const KEY_DOES_NOT_EXIST: u16 = 1176;
    pub const TRG_ALREADY_EXISTS: u16 = 1359;
    pub const TRG_DOES_NOT_EXIST: u16 = 1360;
    pub const TRG_ON_VIEW_OR_TEMP_TABLE: u16 = 1361;
    pub const TRG_CANT_CHANGE_ROW: u16 = 1362;
    pub const TRG_NO_SUCH_ROW_IN_TRG: u16 = 1363;
    pub const SP_BAD_SQLSTATE: u16 = 1407;
    pub const SP_NO_RETSET: u16 = 1415;
    pub const COMMIT_NOT_ALLOWED_IN_SF_OR_TRG: u16 = 1422;
    pub const TRG_IN_WRONG_SCHEMA: u16 = 1435;
    pub const CANT_UPDATE_USED_TABLE_IN_SF_OR_TRG: u16 = 1442;
    pub const SIGNAL_NOT_FOUND: u16 = 1643;
    pub const SIGNAL_EXCEPTION: u16 = 1644;
}

fn state_of(code: u16) -> &'static str {
    use code::*;
    match code {
        ACCESS_DENIED => "28000",
        NO_DB => "3D000",
        UNKNOWN_COM | NET_PACKET_TOO_LARGE | TOO_MANY_CONNECTIONS | NOT_SUPPORTED_AUTH_MODE => "08004",
        BAD_NULL | DUP_ENTRY | NON_UNIQ_ERROR => "23000",
        BAD_DB
        | PARSE
        | NOT_SUPPORTED_YET
        | TOO_LONG_IDENT
        | INVALID_DEFAULT
        | MULTIPLE_PRI_KEY
        | WRONG_AUTO_KEY
        | SP_DOES_NOT_EXIST
        | WRONG_PARAMCOUNT_TO_NATIVE_FCT
        | NONUNIQ_TABLE
        | DERIVED_MUST_HAVE_ALIAS
        | DBACCESS_DENIED
        | TABLEACCESS_DENIED
        | NONEXISTING_GRANT
        | PASSWORD_NO_MATCH
        | SPECIFIC_ACCESS_DENIED
        | CANT_CREATE_USER_WITH_GRANT
        | SP_BAD_SQLSTATE
        | KEY_DOES_NOT_EXIST
        | WRONG_TABLE_NAME => "42000",
        SP_NO_RETSET => "0A000",
        LOCK_DEADLOCK => "40001",
        TABLE_EXISTS => "42S01",
        BAD_TABLE | NO_SUCH_TABLE => "42S02",
        BAD_FIELD => "42S22",
        DUP_FIELDNAME => "42S21",
        WRONG_VALUE_COUNT_ON_ROW => "21S01",
        OPERAND_COLUMNS | SUBQUERY_NO_1_ROW | WRONG_NUMBER_OF_COLUMNS_IN_SELECT => "21000",
        WARN_DATA_OUT_OF_RANGE | DATA_OUT_OF_RANGE => "22003",
        TRUNCATED_WRONG_VALUE => "22007",
        DATA_TOO_LONG => "22001",
        INVALID_USE_OF_NULL => "22004",
        WARN_DATA_TRUNCATED => "01000",
        OUT_OF_SORTMEMORY => "HY001",
        _ => "HY000",
    }
}

impl SqlError {
    pub fn new(code: u16, message: impl Into<String>) -> SqlError {
        SqlError { code, state: state_of(code), message: message.into() }
    }

    pub fn not_supported(what: impl std::fmt::Display) -> SqlError {
        SqlError::new(code::NOT_SUPPORTED_YET, format!("This version of Shoal doesn't yet support '{what}'"))
    }

    pub fn parse(msg: impl std::fmt::Display) -> SqlError {
        SqlError::new(
            code::PARSE,
            format!("You have an error in your SQL syntax; check the manual that corresponds to your Shoal server version: {msg}"),
        )
    }

    pub fn bad_field(name: &str, place: &str) -> SqlError {
        SqlError::new(code::BAD_FIELD, format!("Unknown column '{name}' in '{place}'"))
    }

    pub fn no_such_table(db: &str, table: &str) -> SqlError {
        SqlError::new(code::NO_SUCH_TABLE, format!("Table '{db}.{table}' doesn't exist"))
    }

    pub fn bad_db(db: &str) -> SqlError {
        SqlError::new(code::BAD_DB, format!("Unknown database '{db}'"))
    }

    pub fn internal(msg: impl std::fmt::Display) -> SqlError {
        SqlError::new(code::UNKNOWN, format!("{msg}"))
    }

    /// A cluster error that surfaced while running a statement. Callers that know better (a
    /// duplicate key with its value, a missing table by its SQL name) map those cases first.
    pub fn from_cluster(e: &ShoalError) -> SqlError {
        use code::*;
        match e.code {
            ErrorCode::DuplicateKey if crate::unique::is_worded(e) => SqlError::new(DUP_ENTRY, e.message.clone()),
            ErrorCode::DuplicateKey => {
                SqlError::new(DUP_ENTRY, format!("Duplicate entry for key 'PRIMARY': {}", e.message))
            }
            ErrorCode::NoSuchTable => SqlError::new(NO_SUCH_TABLE, e.message.clone()),
            ErrorCode::TableExists => SqlError::new(TABLE_EXISTS, e.message.clone()),
            ErrorCode::TriggerExists => SqlError::new(TRG_ALREADY_EXISTS, "Trigger already exists"),
            ErrorCode::NoSuchTrigger => SqlError::new(TRG_DOES_NOT_EXIST, "Trigger does not exist"),
            ErrorCode::NullViolation => SqlError::new(BAD_NULL, e.message.clone()),
            ErrorCode::TooLarge => SqlError::new(TOO_BIG_ROWSIZE, e.message.clone()),
            ErrorCode::TypeMismatch => SqlError::new(TRUNCATED_WRONG_VALUE_FOR_FIELD, e.message.clone()),
            ErrorCode::TableFull => SqlError::new(RECORD_FILE_FULL, e.message.clone()),
            ErrorCode::Timeout => SqlError::new(
                LOCK_WAIT_TIMEOUT,
                format!("Lock wait timeout exceeded; try restarting transaction ({})", e.message),
            ),
            ErrorCode::LockWaitTimeout => SqlError::new(
                LOCK_WAIT_TIMEOUT,
                format!("Lock wait timeout exceeded; try restarting transaction ({})", e.message),
            ),
            // The cluster rolled the whole transaction back (a failure, a lock timeout that
            // broke a deadlock, an idle timeout): MySQL's answer for that is 1213.
            ErrorCode::TxnAborted => SqlError::new(
                LOCK_DEADLOCK,
                format!("Deadlock found when trying to get lock; try restarting transaction ({})", e.message),
            ),
            ErrorCode::TooManyLocks => SqlError::new(LOCK_TABLE_FULL, e.message.clone()),
            ErrorCode::SchemaChanged => SqlError::new(
                TABLE_DEF_CHANGED,
                format!("Table definition has changed, please retry transaction ({})", e.message),
            ),
            ErrorCode::InvalidArgument => SqlError::new(UNKNOWN, e.message.clone()),
            ErrorCode::Internal => SqlError::new(UNKNOWN, format!("internal error: {}", e.message)),
            _ => SqlError::new(GET_ERRMSG, format!("Got error {} '{}' from the cluster", e.code.name(), e.message)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_follow_mysql() {
        assert_eq!(SqlError::new(code::DUP_ENTRY, "x").state, "23000");
        assert_eq!(SqlError::new(code::NO_SUCH_TABLE, "x").state, "42S02");
        assert_eq!(SqlError::new(code::BAD_FIELD, "x").state, "42S22");
        assert_eq!(SqlError::new(code::DATA_TOO_LONG, "x").state, "22001");
        assert_eq!(SqlError::new(code::ACCESS_DENIED, "x").state, "28000");
        assert_eq!(SqlError::new(code::NO_DEFAULT_FOR_FIELD, "x").state, "HY000");
        assert_eq!(SqlError::new(code::INVALID_USE_OF_NULL, "x").state, "22004");
        assert_eq!(SqlError::new(code::WARN_DATA_TRUNCATED, "x").state, "01000");
        let e = SqlError::from_cluster(&ShoalError::new(ErrorCode::Timeout, "slow"));
        assert_eq!((e.code, e.state), (1205, "HY000"));
        let e = SqlError::from_cluster(&ShoalError::new(ErrorCode::PartitionUnavailable, "gone"));
        assert_eq!(e.code, 1296);
    }
}
