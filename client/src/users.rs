//! SQL users in the catalog: the admin calls a SQL node makes for CREATE/DROP/ALTER USER and
//! GRANT/REVOKE, and the read of the whole user table it caches. Each change answers with the
//! users version it produced; the map (`ClusterState::users_version`) tells every other SQL
//! node that its cache is behind.

use shoal_proto::convert::auth_plugin_to_pb;
use shoal_proto::pb;
use shoal_proto::{AccountName, PasswordHashes, ShoalError, UserAccount};

use crate::{Client, Result};

/// The user table at one version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Users {
    pub version: u64,
    pub accounts: Vec<UserAccount>,
}

impl Client {
    /// The user table from the mgmd leader (the newest applied one).
    pub async fn list_users(&self) -> Result<Users> {
        let r = self
            .mgmd()
            .on_leader(|mut c| async move {
                let r = c.list_users(pb::Empty {}).await?.into_inner();
                let e = r.error.clone();
                Ok((r, e))
            })
            .await?;
        let accounts = r.users.into_iter().map(UserAccount::try_from).collect::<Result<Vec<_>>>()?;
        Ok(Users { version: r.users_version, accounts })
    }

    /// Creates accounts, all or none (USER_EXISTS names the ones that exist). Returns the
    /// users version after the change.
    pub async fn create_users(&self, users: &[UserAccount], if_not_exists: bool) -> Result<u64> {
        let req = pb::CreateUsersRequest { users: users.iter().map(pb::UserAccount::from).collect(), if_not_exists };
        self.user_call(move |mut c| {
            let req = req.clone();
            async move { Ok(c.create_users(req).await?.into_inner()) }
        })
        .await
    }

    pub async fn drop_users(&self, accounts: &[AccountName], if_exists: bool) -> Result<u64> {
        let req = pb::DropUsersRequest { accounts: accounts.iter().map(pb::AccountName::from).collect(), if_exists };
        self.user_call(move |mut c| {
            let req = req.clone();
            async move { Ok(c.drop_users(req).await?.into_inner()) }
        })
        .await
    }

    pub async fn set_password(&self, account: &AccountName, password: &PasswordHashes, if_exists: bool) -> Result<u64> {
        let req = pb::SetPasswordRequest {
            account: Some(pb::AccountName::from(account)),
            plugin: auth_plugin_to_pb(password.plugin) as i32,
            native_hash: password.native.clone(),
            sha2_hash: password.sha2.clone(),
            if_exists,
        };
        self.user_call(move |mut c| {
            let req = req.clone();
            async move { Ok(c.set_password(req).await?.into_inner()) }
        })
        .await
    }

    /// GRANT (or REVOKE) ALL PRIVILEGES ON `database`.* — ON *.* when `database` is None.
    pub async fn grant(&self, accounts: &[AccountName], database: Option<&str>, revoke: bool) -> Result<u64> {
        let req = pb::GrantRequest {
            accounts: accounts.iter().map(pb::AccountName::from).collect(),
            database: database.unwrap_or_default().to_string(),
            revoke,
        };
        self.user_call(move |mut c| {
            let req = req.clone();
            async move { Ok(c.grant(req).await?.into_inner()) }
        })
        .await
    }

    async fn user_call<F, Fut>(&self, f: F) -> Result<u64>
    where
        F: Fn(pb::mgmd_client::MgmdClient<tonic::transport::Channel>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<pb::AdminResponse, tonic::Status>>,
    {
        let r = self
            .mgmd()
            .on_leader(|c| {
                let call = f(c);
                async move {
                    let r = call.await?;
                    let e = r.error.clone();
                    Ok((r, e))
                }
            })
            .await?;
        if r.users_version == 0 {
            return Err(ShoalError::internal("mgmd answered a user command without a users version"));
        }
        Ok(r.users_version)
    }
}
